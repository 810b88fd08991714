"""config/examples/own-model.yaml, the README's example of a base and prompts of one's own: with
a model directory in place of its placeholder it resolves to a LoRA and a full fine-tuning arm on
its GSM8K-format pool, and its placeholder base is refused naming the key. Its run through
Snakemake on ten architectures is tests/e2e/test_arch_matrix.py (-m archs)."""

from __future__ import annotations

import json

import pytest

from arenaflow import config
from arenaflow.pools.imported import import_rows

EXAMPLE = "config/examples/own-model.yaml"


def resolved(repo_root, tmp_path, **over):
    at_base = tmp_path / "base.yaml"
    at_base.write_text(json.dumps(over))  # YAML reads JSON
    raw, files = config.load_configs([repo_root / EXAMPLE, at_base])
    return config.resolve(raw, repo_root=repo_root, config_file=EXAMPLE, sources=files)


def test_the_example_resolves_on_a_model_directory_to_its_two_arms(repo_root, tmp_path):
    cfg = resolved(repo_root, tmp_path, base={"path": "models/tiny-arith"})
    arms = cfg["arms"]
    assert sorted(arms) == ["full", "lora"]
    assert arms["lora"]["hyper"]["method"] == "lora" and arms["full"]["hyper"]["method"] == "full"
    assert arms["lora"]["hyper"]["lora"]["target_modules"] == ["all-linear"]
    assert {a["corpus"] for a in arms.values()} == {"sft"}


def test_the_example_pools_read_as_gsm8k_with_their_gold(repo_root):
    raw, _ = config.load_configs([repo_root / EXAMPLE])
    for pid, pool in raw["pools"].items():
        rows = import_rows(pid, {"kind": "math", **pool}, root=repo_root)
        assert len(rows) == pool["n"]
        for r in rows:  # the gold after '####' is the answer the worked solution ends on
            assert r["reference"].endswith(f"The answer is {r['gold']}.")
            assert r["reference"].split("\n")[0].endswith(f"= {r['gold']}.")


def test_the_placeholder_base_is_refused_naming_the_key(repo_root, tmp_path):
    with pytest.raises(config.ConfigError, match=r"key 'base/path': no model directory .*my-model"):
        resolved(repo_root, tmp_path)


def base_dir(tmp_path, model_type: str, arch: str, **cfg):
    """A base of `model_type` that is its config.json alone: the base key naming it, with ChatML
    as its chat template (it has none of its own, which the config check refuses first)."""
    d = tmp_path / model_type
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"model_type": model_type, "architectures": [arch], **cfg})
    )
    return {"path": str(d), "chat_template": "chatml"}


@pytest.mark.parametrize(
    ("model_type", "arch", "extra", "part"),
    [
        ("qwen3_moe", "Qwen3MoeForCausalLM", {"num_experts": 4}, "MoE of 4 experts"),
        ("mixtral", "MixtralForCausalLM", {"num_local_experts": 8}, "MoE of 8 experts"),
        ("falcon_h1", "FalconH1ForCausalLM", {}, "has Mamba mixers"),
    ],
)
def test_all_linear_on_fused_experts_or_mamba_mixers_is_refused_before_any_job(
    repo_root, tmp_path, model_type, arch, extra, part
):
    base = base_dir(tmp_path, model_type, arch, **extra)
    with pytest.raises(config.ConfigError) as e:
        resolved(repo_root, tmp_path, base=base)
    msg = str(e.value)
    assert "arms/lora.yaml: arm 'lora'" in msg and f"{arch} (model_type '{model_type}')" in msg
    assert part in msg and "all-linear" in msg


def test_named_targets_on_a_hybrid_resolve_and_its_mixers_out_proj_is_refused(repo_root, tmp_path):
    base = base_dir(tmp_path, "falcon_h1", "FalconH1ForCausalLM")
    ok = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj"]
    cfg = resolved(repo_root, tmp_path, base=base, train_defaults={"lora": {"target_modules": ok}})
    assert cfg["arms"]["lora"]["hyper"]["lora"]["target_modules"] == ok
    with pytest.raises(config.ConfigError, match=r"target \['out_proj'\] includes them"):
        resolved(
            repo_root,
            tmp_path,
            base=base,
            train_defaults={"lora": {"target_modules": ["q_proj", "out_proj"]}},
        )
