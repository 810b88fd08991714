"""profiles/slurm without a cluster: the test profile is the real one plus test-cluster settings
only, and a dry run through it asks GRES for exactly the GPU rules."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml
from dagrun import dry_run, planned_resources

REPO = Path(__file__).resolve().parents[2]
REAL = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
TEST = yaml.safe_load((REPO / "tests/slurm/profile/config.yaml").read_text())
TEST_ONLY = {
    "slurm-status-command",
    "slurm-init-seconds-before-status-checks",
    "slurm-keep-successful-logs",
    "slurm-no-account",
}
# readout_math: a readout rule per suite (rules/evals.smk)
GPU_RULES = {"train_arm": None, "sample_candidates": 1, "readout_math": 1}


def test_the_test_profile_is_the_real_profile_plus_test_cluster_settings():
    assert {k: v for k, v in TEST.items() if k not in TEST_ONLY} == REAL
    assert "slurm-status-command" not in REAL  # sacct where the cluster has slurmdbd (the default)
    assert not any("partition" in str(k) or "account" in str(k) for k in REAL["default-resources"])
    assert "cpus_per_task" not in REAL["default-resources"]  # threads decide: train gets nproc CPUs


def test_a_dry_run_asks_gres_for_gpu_rules_only(tmp_path):
    arms = tmp_path / "arms"
    shutil.copytree(REPO / "config/arms", arms)
    (arms / "B2.yaml").write_text("init: R2d\ncorpus: rft_r3\nhyper: {lr: 3.0e-3, nproc: 2}\n")
    cmd = dry_run(
        "bundles/B3f",
        "--profile",
        str(REPO / "profiles/slurm"),
        results=tmp_path / "r",
        arms=arms,
    )
    seen = set()
    for rule, block, res in planned_resources(cmd):
        gres = re.search(r"\bgres=gpu:(\d+)", res)
        assert not re.search(r"\bgpus?=", res), (rule, res)  # never the plugin's gpu=N
        if rule in GPU_RULES:
            want = GPU_RULES[rule] or (2 if "arm=B2" in block else 1)
            assert gres and int(gres.group(1)) == want, (rule, res)
        else:
            assert gres is None, (rule, res)
        seen.add(rule)
    assert (
        set(GPU_RULES) <= seen and {"build_pool", "build_corpus", "compare", "nominate"} <= seen
    ), seen
