"""Sharded sampling and readouts in the DAG (config `shards:`), planned by Snakemake on the
embedded default with corpus rft_r1 and suite math in 3 shards: N shard jobs and one merge for
each, the unsharded rules for the rest; touching an arm reruns its readout shards only, and a
lost shard reruns alone. The pools are built for real (CPU, ~40 s on 2 cores), every other output
is a placeholder written in the plan's order, so Snakemake judges it by modification times."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from dagrun import CONFIG, REPO, planned_jobs, snakemake

pytestmark = pytest.mark.dag

SHARDS = "corpora:\n  rft_r1: {shards: 3}\nevals:\n  math: {shards: 3}\n"
TARGETS = ("readouts/math/B3/greedy.r0.parquet", "readouts/math/B1/greedy.r0.parquet")


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    (root / "shards.yaml").write_text(SHARDS)
    shutil.copytree(REPO / "config/arms", root / "arms")
    kw = dict(
        results=root / "results", arms=root / "arms", configfiles=(*CONFIG, root / "shards.yaml")
    )
    dry = snakemake("-n", *TARGETS, **kw)
    snakemake(*TARGETS, "--until", "build_pool", **kw)
    outputs = re.findall(r"^\s+output: (.*)$", dry.stdout + dry.stderr, re.M)
    for line in outputs:  # in the plan's order: each placeholder newer than its inputs
        for out in (o.removesuffix(" (update)").strip() for o in line.split(",")):
            path = kw["results"] / out
            if out.startswith("pools/"):
                continue
            if out.startswith("runs/"):  # a run is a directory
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("")
    return {"dry": dry, "kw": kw}


def plan(planned, targets=TARGETS) -> list[tuple[str, str]]:
    return planned_jobs(snakemake("-n", *targets, **planned["kw"]))


def test_a_sharded_corpus_and_suite_plan_n_shard_jobs_and_one_merge_each(planned):
    jobs = planned_jobs(planned["dry"])
    assert sorted(wc for r, wc in jobs if r == "sample_candidates_shard") == [
        f"corpus=rft_r1, shard={i}-of-3" for i in range(3)
    ]
    assert [wc for r, wc in jobs if r == "merge_samples"] == ["corpus=rft_r1"]
    assert {wc for r, wc in jobs if r == "sample_candidates"} == {"corpus=rft_r2", "corpus=rft_r3"}
    for arm in ("B1", "B3"):
        shards = [wc for r, wc in jobs if r == "readout_math_shard" and f"rarm={arm}," in wc]
        assert sorted(shards) == [f"rarm={arm}, shard={i}-of-3" for i in range(3)]
        assert [wc for r, wc in jobs if r == "merge_readouts_math"].count(f"rarm={arm}") == 1
    assert "readout_math" not in {r for r, _ in jobs}


def test_touching_an_arm_reruns_its_shards_and_not_its_siblings(planned):
    assert plan(planned) == []
    os.utime(planned["kw"]["arms"] / "B3.yaml")
    jobs = plan(planned)
    assert sorted(jobs) == sorted(
        [("train_arm", "arm=B3"), ("merge_readouts_math", "rarm=B3")]
        + [("readout_math_shard", f"rarm=B3, shard={i}-of-3") for i in range(3)]
    )
    snakemake("--touch", *TARGETS, **planned["kw"])  # up to date again for the next test


def test_a_preempted_shard_reruns_alone_then_its_merge(planned):
    """Preempted: its part is missing and the merge never ran; the other shards' parts stand."""
    results = planned["kw"]["results"]
    for merged in (results / "readouts/math/B1").glob("*.parquet"):
        merged.unlink()
    (results / "readouts/math/B1/served.r2.shards/1-of-3.parquet").unlink()
    assert sorted(plan(planned)) == [
        ("merge_readouts_math", "rarm=B1"),
        ("readout_math_shard", "rarm=B1, shard=1-of-3"),
    ]
    (results / "candidates/rft_r1/samples.jsonl").unlink()
    (results / "candidates/rft_r1/samples.shards/2-of-3.jsonl").unlink()
    assert sorted(plan(planned, ["candidates/rft_r1/samples.jsonl"])) == [
        ("merge_samples", "corpus=rft_r1"),
        ("sample_candidates_shard", "corpus=rft_r1, shard=2-of-3"),
    ]
