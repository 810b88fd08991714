"""benchmarks/soak.py run whole, every check of its report passing: at its CI setting (the `dag`
tier: the smallest DAG up to r3 built once and shared, faults only in the continual round), and
at its small setting (marker `soak`, by hand: no shared prefix, faults anywhere in the DAG)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dagrun import REPO

CHECKS = 7


def soak(tmp_path, *args: str, timeout: int) -> tuple[dict, str]:
    """Run the harness on a root of the test's own (its tmpfs mounts under it, never on another
    run's root); its report and its stdout."""
    report = tmp_path / "soak.json"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks/soak.py"),
        *args,
        "--root",
        str(tmp_path / "soak"),
        "--out",
        str(report),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rep = json.loads(report.read_text())
    assert all(rep["checks"].values()) and len(rep["checks"]) == CHECKS
    assert "check: 0 complete outputs recomputed" in proc.stdout
    return rep, proc.stdout


def assert_faults_of_each_kind_landed(rep: dict) -> None:
    kinds = [f["kind"] for f in rep["faulty"]["faults"]]
    assert sorted(k for k in kinds if k != "disk_full") == ["kill_job", "term_snakemake"]
    # disk-full needs a tmpfs mount (root); otherwise its skip is recorded with the reason
    assert ("disk_full" in kinds) == (rep["faulty"]["disk_full_skipped"] is None)
    for fault in rep["faulty"]["faults"]:
        assert fault["jobs_running"], fault
    assert rep["reference"]["records"] == rep["faulty"]["records"]
    assert any(k.startswith("bundles/Bsoak/") for k in rep["faulty"]["records"])


# ~5 min on an idle 2-core machine (docs/operations.md: Soak under random faults)
@pytest.mark.dag
def test_the_soak_harness_at_its_ci_setting_passes_every_check(tmp_path):
    rep, _ = soak(
        tmp_path,
        *("--rounds", "1", "--faults", "2", "--seed", "3", "--shared-prefix", "--pool-n", "12"),
        *("--tmpfs-size", "64m", "--disk-full-hold", "30"),
        timeout=1500,
    )
    assert_faults_of_each_kind_landed(rep)
    # both runs started from the prefix, complete: the faults hit only what was left, the
    # continual round's jobs and its bundle (none of the prefix's outputs was written again)
    assert rep["prefix"]["rc"] == 0 and rep["reference"]["recomputed_complete"] == []
    start = rep["faulty"]["complete_at_start"]
    assert "nominations/r3.json" in start and "nominations/r4.json" not in start
    assert {"corpora/rft_r3/rows.jsonl", "corpora/rft_r3/manifest.json"} <= set(start)
    assert any(k.startswith("bundles/B3f/") for k in start)
    assert "bundles/B3f" not in rep["targets"]


# ~15 min on an idle 2-core machine: run by hand (python -m pytest -q -m soak tests/e2e)
@pytest.mark.soak
def test_the_soak_harness_at_its_small_setting_passes_every_check(tmp_path):
    rep, _ = soak(
        tmp_path,
        *("--rounds", "1", "--faults", "2", "--seed", "3"),
        *("--tmpfs-size", "512m", "--disk-full-hold", "30"),
        timeout=1800,
    )
    assert_faults_of_each_kind_landed(rep)
    assert rep["prefix"] is None and "bundles/B3f" in rep["targets"]
