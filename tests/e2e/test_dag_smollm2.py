"""The lineage on a real pretrained model: the smallest DAG (tests/e2e/mini.yaml) through
Snakemake on CPU with SmolLM2-135M-Instruct as the base, its pad token stripped (as Llama 3
ships), at config/smollm2.yaml's sizes (tests/e2e/smollm2.yaml; ~10 minutes on 2 cores). Its
own chat template differs from arenaflow's renderer; the bundle must still pass every check."""

from __future__ import annotations

import json

import pytest
from dagrun import CONFIG, REPO, STAGES, build, planned_jobs, serve_greedy
from realmodel import import_smollm2, strip_pad_token

pytestmark = pytest.mark.dag

OVERLAYS = (
    *CONFIG,
    REPO / "tests/e2e/mini.yaml",
    REPO / "config/smollm2.yaml",
    REPO / "tests/e2e/smollm2.yaml",
)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("smollm2")
    return strip_pad_token(import_smollm2(root / "smollm2"), root / "smollm2-nopad")


@pytest.fixture(scope="module")
def built(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e_smollm2")
    at_base = root / "base.yaml"
    at_base.write_text(json.dumps({"base": {"path": str(base)}}))  # YAML reads JSON
    return build(root, (*OVERLAYS, at_base)) | {"base": base}


def test_every_stage_runs_on_the_real_model(built):
    ran = {rule for rule, _ in planned_jobs(built["dry"])}
    assert STAGES <= ran, f"stages not planned: {sorted(STAGES - ran)}"
    results = built["results"]
    for corpus in ("rft_r1", "rft_r2", "rft_r3"):
        stats = json.loads((results / f"corpora/{corpus}/stats.json").read_text())
        assert stats["solved"] >= 1, f"{corpus}: SmolLM2 solved nothing ({stats})"
        samples = (results / f"candidates/{corpus}/samples.jsonl").read_text().splitlines()
        assert len(samples) == stats["prompts"] * stats["k"]
    for arm in ("S1", "R220", "R2d", "B3"):
        evidence = json.loads((results / f"runs/{arm}/final/training_evidence.json").read_text())
        assert evidence["optimizer_steps"] >= 1 and evidence["tokens_seen"] > 0, (arm, evidence)
        adapter = json.loads((results / f"runs/{arm}/final/adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str(built["base"]), arm


def test_the_bundle_passes_every_check_and_keeps_the_bases_tokenizer(built):
    bundle = built["results"] / "bundles/B3f"
    checks = json.loads((bundle / "checks.json").read_text())
    assert checks.pop("vllm_offline")["verdict"] in ("PASS", "NOT_RUN")  # PASS where vLLM runs
    assert {name: c["verdict"] for name, c in checks.items()} == {
        "evidence": "PASS",
        "nomination": "PASS",
        "reload": "RELOAD_CHECK_PASS",
        "template_compiles": "PASS",
        "template_matches_renderer": "PASS",
        "serving_engines": "PASS",  # rank 8 on q..down_proj: an adapter to every engine
    }
    ours = json.loads((bundle / "tokenizer_config.json").read_text())
    theirs = json.loads((built["base"] / "tokenizer_config.json").read_text())
    assert "pad_token" not in theirs and ours.get("pad_token") is None
    assert ours["eos_token"] == theirs["eos_token"] == "<|im_end|>"
    native = (built["base"] / "chat_template.jinja").read_text()
    assert (bundle / "chat_template.jinja").read_text() != native


def test_the_bundle_reloads_on_the_pad_less_base_and_stops_as_served(built):
    bundle = built["results"] / "bundles/B3f"
    messages = [
        {"role": "system", "content": (bundle / "system_prompt.txt").read_text()},
        {"role": "user", "content": "What is 12 + 30? Reply with just the number."},
    ]
    gen = json.loads((bundle / "generation_config.json").read_text())
    tok, gen, answer = serve_greedy(bundle, built["base"], messages, gen["max_new_tokens"])
    assert tok.pad_token is None
    assert answer[-1].item() in gen["eos_token_id"], tok.decode(answer)
