"""profiles/gpu-local: every GPU rule asks `local_gpus` (train_arm its nproc), CPU rules none,
and the profile caps it at 1, so a one-GPU workstation never runs two GPU jobs at once. The
name is not `gpu`, which the Slurm plugin would submit as --gpus (tests/slurm checks GRES)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from dagrun import dry_run, planned_resources

REPO = Path(__file__).resolve().parents[2]
# readout_math: a readout rule per suite (rules/evals.smk)
GPU_RULES = {"train_arm": None, "sample_candidates": 1, "readout_math": 1}


def test_the_profile_caps_local_gpus_at_one_and_sets_nothing_else():
    assert yaml.safe_load((REPO / "profiles/gpu-local/config.yaml").read_text()) == {
        "resources": ["local_gpus=1"]
    }


@pytest.mark.parametrize("cap", [None, 8])
def test_a_dry_run_asks_local_gpus_for_gpu_rules_only(tmp_path, cap):
    """With the profile's cap of 1 Snakemake shows a 2-GPU arm's request scaled down to 1 (it
    still runs alone); with a cap of 8, its nproc."""
    arms = tmp_path / "arms"
    shutil.copytree(REPO / "config/arms", arms)
    (arms / "B2.yaml").write_text("init: R2d\ncorpus: rft_r3\nhyper: {lr: 3.0e-3, nproc: 2}\n")
    cmd = dry_run(
        "bundles/B3f",
        "--cores",
        "16",
        "--profile",
        str(REPO / "profiles/gpu-local"),
        results=tmp_path / "r",
        arms=arms,
    ) + (["--resources", f"local_gpus={cap}"] if cap else [])
    seen = set()
    for rule, block, res in planned_resources(cmd):
        asked = re.search(r"\blocal_gpus=(\d+)", res)
        assert not re.search(r"\bgpus?=", res), (rule, res)
        if rule in GPU_RULES:
            want = GPU_RULES[rule] or (2 if cap and "arm=B2" in block else 1)
            assert asked and int(asked.group(1)) == want, (rule, res)
        else:
            assert asked is None, (rule, res)
        seen.add(rule)
    assert (
        set(GPU_RULES) <= seen and {"build_pool", "build_corpus", "compare", "nominate"} <= seen
    ), seen
