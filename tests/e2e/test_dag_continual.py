"""Continual rounds through Snakemake on CPU (the `dag` tier): the smallest DAG's round r3 with a
bar nothing can clear, then the template's rounds r4 and r5. r3 keeps its incumbent,
so r4 samples from and starts at R2d's weights; r4 keeps its incumbent too, and the stop rule
(one round kept) ends the run before r5 submits anything.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
import yaml
from dagrun import MINI, REPO, planned_blocks, planned_jobs, snakemake

pytestmark = pytest.mark.dag

NOTHING_CLEARS = [
    {"metric": "delta", "op": ">", "value": 100.0, "note": "no candidate can clear this"}
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("continual")
    arms, grid = root / "arms", root / "grid"
    shutil.copytree(REPO / "config/arms", arms)
    shutil.copytree(REPO / "config/continual", grid)
    extra = root / "continual.yaml"
    extra.write_text(
        yaml.safe_dump(
            {
                "rounds": {"r3": {"bar": NOTHING_CLEARS}},
                "continual": {
                    "arms_dir": str(grid),
                    "stop": {"after_kept_rounds": 1},
                    "pool": {
                        "n": 24,
                        "seed": 40,
                        "split": "train",
                        "categories": {"add": 1, "sub": 1},
                    },
                },
            }
        )
    )
    files = (*MINI, extra)
    run = dict(results=root / "results", arms=arms, configfiles=files)
    dry = snakemake("-n", "rounds/r5.json", **run)
    snakemake("rounds/r5.json", **run)
    return {**run, "grid": grid, "dry": dry}


def read(built, path):
    return json.loads((built["results"] / path).read_text())


def test_the_dry_run_shows_the_next_round_waiting_on_the_nomination(built):
    jobs = planned_jobs(built["dry"])
    assert ("nominee_run", "arm=r3-nominee") in jobs and ("nominate", "rnd=r3") in jobs
    assert {wc for r, wc in jobs if r == "train_arm"} >= {"arm=r4-lo", "arm=r4-hi"}
    # r5's arms wait on r4's nomination: the walk asks for it only once r4 is judged
    assert not [wc for r, wc in jobs if r in ("train_arm", "sample_candidates") and "r5" in wc]


def test_a_round_that_promotes_nobody_hands_its_incumbent_to_the_next(built):
    res = built["results"]
    assert read(built, "nominations/r3.json")["promoted"] == "R2d"
    alias = read(built, "runs/r3-nominee/final/nominee.json")
    assert (alias["arm"], alias["kept"]) == ("R2d", True)
    assert (res / "runs/r3-nominee/final/adapter_model.safetensors").read_bytes() == (
        res / "runs/R2d/final/adapter_model.safetensors"
    ).read_bytes()
    # r4 samples from the nominee and its arms start from it
    run = {k: built[k] for k in ("results", "arms", "configfiles")}
    forced = snakemake("-n", "-f", "candidates/r4-corpus/samples.jsonl", **run)
    [(_, block)] = [
        b for b in planned_blocks(forced.stdout + forced.stderr) if b[0] == "sample_candidates"
    ]
    assert "runs/r3-nominee/final" in re.search(r"input: (.*)", block).group(1)
    assert read(built, "runs/r4-lo/final/training_evidence.json")["init"] == "r3-nominee"
    # a fresh slice: no prompt of r4's pool is in an earlier training pool
    prompts = {
        p: {json.loads(x)["prompt"] for x in (res / f"pools/{p}.jsonl").read_text().splitlines()}
        for p in ("r4-pool", "math_r1", "math_r2", "math_r3", "sft_s1")
    }
    assert not prompts["r4-pool"] & set().union(*(v for k, v in prompts.items() if k != "r4-pool"))


def test_the_stop_rule_ends_the_run_before_the_next_round_submits_anything(built):
    res = built["results"]
    st = read(built, "rounds/r5.json")
    assert (
        st["rounds"] == ["r4"] and "1 round(s) in a row kept their incumbent (r4)" in st["stopped"]
    )
    assert st["trajectory"][0]["kept"] and st["trajectory"][0]["incumbent"] == "r3-nominee"
    assert not list((res / "runs").glob("r5-*")) and not (res / "candidates/r5-corpus").exists()
    assert (res / "rounds/r5.png").read_bytes()[:4] == b"\x89PNG"


def test_touching_one_arm_of_the_grid_reruns_its_chain_and_not_its_sibling(built):
    os.utime(built["grid"] / "lo.yaml")
    try:
        jobs = planned_jobs(
            snakemake(
                "-n", "rounds/r5.json", **{k: built[k] for k in ("results", "arms", "configfiles")}
            )
        )
    finally:
        snakemake(
            "--touch", "rounds/r5.json", **{k: built[k] for k in ("results", "arms", "configfiles")}
        )
    trained = {wc for r, wc in jobs if r == "train_arm"}
    assert "arm=r4-lo" in trained and "arm=r4-hi" not in trained
    assert not {r for r, _ in jobs} & {"sample_candidates", "build_pool", "merge_arm"}
