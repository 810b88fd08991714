"""The smallest DAG that runs every rule (tests/e2e/mini.yaml) through Snakemake on CPU: the
default test tier's end-to-end check (about 2 minutes on 2 cores).

One module-scoped build backs every test: the dry run's lineage, the bundle that reloads as a
server would, evidence that matches the corpus, every manifest, the `touch` semantics, and a
config error that stops `snakemake -n`.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from dagrun import MINI, REPO, build, planned_jobs, snakemake

STAGES = {"build_pool", "sample_candidates", "verify_candidates", "build_corpus", "train_arm",
          "readout", "compare", "register_bar", "nominate", "build_bundle"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(tmp_path_factory.mktemp("e2e_small"), MINI)


def test_dry_run_lists_every_stage_and_the_lineage(built):
    jobs = planned_jobs(built["dry"])
    assert STAGES <= {r for r, _ in jobs}
    assert {wc.split("=")[1] for r, wc in jobs if r == "train_arm"} == {"S1", "R220", "R2d", "B3"}


def test_bundle_reloads_as_a_server_would(built):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bundle = built["results"] / "bundles/B3f"
    for f in ("adapter_model.safetensors", "adapter_config.json", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
              "serving_config.json", "system_prompt.txt", "training_evidence.json", "README.md",
              "manifest.json", "reload_check.json"):
        assert (bundle / f).is_file(), f
    assert json.loads((bundle / "reload_check.json").read_text())["verdict"] == "RELOAD_CHECK_PASS"
    tok = AutoTokenizer.from_pretrained(bundle)
    assert tok.chat_template == (bundle / "chat_template.jinja").read_text()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(REPO / "models/tiny-arith"), bundle)
    lora = [n for n, _ in model.named_parameters() if "lora_" in n]
    assert lora, "the reloaded model carries no LoRA weights"
    ids = tok.apply_chat_template([{"role": "user", "content": "Ann has 12 pens and gets 30 more. How many pens now?"}],
                                  add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    gen = json.loads((bundle / "generation_config.json").read_text())
    out = model.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=gen["eos_token_id"],
                         pad_token_id=gen["pad_token_id"])
    assert out[0, -1].item() in gen["eos_token_id"], "greedy generation did not stop on a stop token"


def test_evidence_matches_corpus_and_every_manifest_verifies(built):
    from arenaflow import manifest

    res = built["results"]
    bundle = res / "bundles/B3f"
    evidence = json.loads((bundle / "training_evidence.json").read_text())
    served = json.loads((res / "nominations/r3.json").read_text())["promoted"]
    assert evidence["arm"] == served
    corpus = res / "corpora" / evidence["corpus"]
    assert evidence["dataset_sha256"] == json.loads((corpus / "manifest.json").read_text())["digest"]
    assert evidence["init"] in {"R220", "R2d"}  # R2d when B3 is served, R220 when R2d is kept
    dirs = [bundle, *(res / "runs").glob("*/final"), *(res / "corpora").glob("*")]
    for d in dirs:
        manifest.verify(d)
    assert (bundle / "adapter_model.safetensors").read_bytes() == \
        (res / "runs" / served / "final/adapter_model.safetensors").read_bytes()


def test_touching_an_arm_reruns_exactly_it_and_its_descendants(built):
    arm_file = built["arms"] / "B3.yaml"
    os.utime(arm_file)
    try:
        dry = snakemake("-n", "bundles/B3f", results=built["results"], arms=built["arms"], configfiles=MINI)
    finally:
        # leave the build consistent for the other tests: mark every output up to date again
        snakemake("--touch", "bundles/B3f", results=built["results"], arms=built["arms"], configfiles=MINI)
    jobs = planned_jobs(dry)
    trained = {wc for r, wc in jobs if r == "train_arm"}
    assert trained == {"arm=B3"}
    assert {r for r, _ in jobs} <= {"train_arm", "readout", "compare", "nominate", "build_bundle"}
    readouts = {wc for r, wc in jobs if r == "readout"}
    assert all("rarm=B3" in wc for wc in readouts) and readouts
    assert ("build_bundle", "bundle=B3f") in jobs


def test_a_bad_arm_value_stops_the_dry_run_naming_file_and_key(built, tmp_path):
    arms = tmp_path / "arms"
    shutil.copytree(built["arms"], arms)
    (arms / "B3.yaml").write_text("init: R2d\ncorpus: rft_r3\nhyper: {lr: -1.0e-4}\n")
    proc = snakemake("-n", "bundles/B3f", results=tmp_path / "r", arms=arms, check=False, configfiles=MINI)
    assert proc.returncode != 0
    msg = proc.stdout + proc.stderr
    assert "B3.yaml" in msg and "hyper/lr" in msg, msg[-3000:]
    assert not (tmp_path / "r" / "pools").exists(), "a job ran despite the config error"
