"""The whole DAG through Snakemake on CPU, at the size of tests/e2e/config.yaml.

One module-scoped build (a few minutes on 2 cores) backs every test here: the dry run's
lineage, the bundle that reloads as a server would, evidence that matches the corpus, the
`touch` semantics, and config errors that stop `snakemake -n`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def snakemake(*args: str, results: Path, arms: Path, check: bool = True, timeout: int = 1200,
              configfiles: tuple[Path, ...] = ()):
    # targets first: --configfile and --config take every word after them
    cmd = [sys.executable, "-m", "snakemake", *args, "--cores", "2", "--configfile",
           str(REPO / "config/config.yaml"), str(REPO / "tests/e2e/config.yaml"), *map(str, configfiles),
           "--config", f"results_dir={results}", f"arms_dir={arms}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


def planned_jobs(proc) -> list[tuple[str, str]]:
    """(rule, wildcards) of every job a dry run would run."""
    out = proc.stdout + proc.stderr
    jobs = []
    for block in re.split(r"\n(?=\[.*\]\n(?:local)?(?:rule|checkpoint) )", out):
        m = re.search(r"(?:rule|checkpoint) (\w+):", block)
        if m and m.group(1) != "all":
            wc = re.search(r"wildcards: (.*)", block)
            jobs.append((m.group(1), wc.group(1).strip() if wc else ""))
    return jobs


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    arms = root / "arms"
    shutil.copytree(REPO / "config/arms", arms)
    results = root / "results"
    dry = snakemake("-n", "bundles/B3f", results=results, arms=arms)
    t0 = time.time()
    run = snakemake("bundles/B3f", results=results, arms=arms)
    return {"root": root, "arms": arms, "results": results, "dry": dry, "run": run,
            "wall_s": time.time() - t0}


def test_dry_run_lists_the_whole_lineage(built):
    jobs = planned_jobs(built["dry"])
    rules = {r for r, _ in jobs}
    assert {"build_pool", "sample_candidates", "verify_candidates", "build_corpus", "train_arm",
            "readout", "compare", "nominate", "build_bundle"} <= rules
    trained = {wc.split("=")[1] for r, wc in jobs if r == "train_arm"}
    assert trained == {"S1", "R220", "R2d", "B1", "B2", "B3", "B4"}


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
    assert evidence["init"] in {"R220", "R2d"}  # R2d when R2d itself is served, else a B-arm's init
    dirs = [bundle, *(res / "runs").glob("*/final"), *(res / "corpora").glob("*")]
    for d in dirs:
        manifest.verify(d)
    assert (bundle / "adapter_model.safetensors").read_bytes() == \
        (res / "runs" / served / "final/adapter_model.safetensors").read_bytes()


def test_touching_an_arm_reruns_exactly_it_and_its_descendants(built):
    arm_file = built["arms"] / "B3.yaml"
    os.utime(arm_file)
    try:
        dry = snakemake("-n", "bundles/B3f", results=built["results"], arms=built["arms"])
    finally:
        # leave the build consistent for the other tests: mark every output up to date again
        snakemake("--touch", "bundles/B3f", results=built["results"], arms=built["arms"])
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
    (arms / "B2.yaml").write_text("init: R2d\ncorpus: rft_r3\nhyper: {lr: -1.0e-4}\n")
    proc = snakemake("-n", "bundles/B3f", results=tmp_path / "r", arms=arms, check=False)
    assert proc.returncode != 0
    msg = proc.stdout + proc.stderr
    assert "B2.yaml" in msg and "hyper/lr" in msg, msg[-3000:]
    assert not (tmp_path / "r" / "pools").exists(), "a job ran despite the config error"


def test_the_b3_template_defect_fails_the_bundle_and_leaves_no_directory(built):
    proc = snakemake("bundles/B3", results=built["results"], arms=built["arms"], check=False)
    assert proc.returncode != 0
    log = (built["results"] / "logs/bundles/B3.log").read_text()
    assert "Encountered unknown tag 'raise_exception'" in log
    assert not (built["results"] / "bundles/B3").exists()
    assert not list((built["results"] / "bundles").glob(".B3.*")), "temporary directory left behind"


def test_a_bundle_differing_only_in_serving_files_retrains_nothing(built):
    from arenaflow import bundles

    res = built["results"]
    snakemake("bundles/B3g", results=res, arms=built["arms"])
    dry = snakemake("-n", "bundles/B3h", results=res, arms=built["arms"])
    assert {r for r, _ in planned_jobs(dry)} == {"build_bundle"}
    snakemake("bundles/B3h", results=res, arms=built["arms"])
    differ, same = bundles.diff(res / "bundles/B3g", res / "bundles/B3h")
    assert same, "weights differ between bundles of one arm"
    assert {"serving_config.json", "generation_config.json"} <= set(differ)
    assert not {"adapter_model.safetensors", "adapter_config.json", "chat_template.jinja"} & set(differ)


def test_a_judged_read_packs_the_bundles_readouts_and_unblinds_the_judges_csv(built, tmp_path):
    """config.yaml's judged read B3_vs_R2d: the packet comes from readouts the bundle already
    needed (only judged_pack runs), its key lies outside the judge's directory, and a judge's
    CSV named in config is unblinded into the comparison."""
    import yaml

    res, arms = built["results"], built["arms"]
    dry = snakemake("-n", "judged/B3_vs_R2d/pairs.jsonl", results=res, arms=arms)
    assert {r for r, _ in planned_jobs(dry)} == {"judged_pack"}
    proc = snakemake("-n", "judged/B3_vs_R2d.json", results=res, arms=arms, check=False)
    assert proc.returncode != 0 and "judged/B3_vs_R2d/scores" in proc.stdout + proc.stderr

    snakemake("judged/B3_vs_R2d/pairs.jsonl", results=res, arms=arms)
    assert [p.name for p in (res / "judged/B3_vs_R2d").iterdir()] == ["pairs.jsonl"]
    pairs = [json.loads(x) for x in (res / "judged/B3_vs_R2d/pairs.jsonl").read_text().splitlines()]
    key = json.loads((res / "judged/B3_vs_R2d.key.json").read_text())
    assert len(pairs) == 40 and {p["pair"] for p in pairs} == set(key["pairs"])
    assert key["arms"] == ["B3", "R2d"] and all("B3" not in json.dumps(p) for p in pairs)

    scores = tmp_path / "scores.csv"  # a judge who always prefers side A
    scores.write_text("pair,verdict\n" + "".join(f"{p['pair']},A\n" for p in pairs))
    read = {**yaml.safe_load((REPO / "config/config.yaml").read_text())["judged"]["B3_vs_R2d"], "scores": str(scores)}
    extra = tmp_path / "judged.yaml"
    extra.write_text(yaml.safe_dump({"judged": {"B3_vs_R2d": read}}))
    snakemake("judged/B3_vs_R2d.json", results=res, arms=arms, configfiles=(extra,))
    out = json.loads((res / "judged/B3_vs_R2d.json").read_text())
    sides = [k["A"] for k in key["pairs"].values()]
    assert out["preferred"] == {"B3": sides.count("B3"), "R2d": sides.count("R2d")} and out["ties"] == 0
