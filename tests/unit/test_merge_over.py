"""A lineage config may stand alone (`merge_over: null`): Snakemake, `python -m arenaflow.config`
and `python -m arenaflow.budget.plan` then read it without config/config.yaml under it, so none of
the
default lineage's pools, arms or rounds leak in. Without the key, files merge over config.yaml
as Snakemake merges every --configfile over the Snakefile's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from dagrun import planned_jobs

from arenaflow import config as afconfig

REPO = Path(__file__).resolve().parents[2]


def _standalone(tmp_path: Path, **extra) -> Path:
    """config.yaml + tests/e2e/config.yaml as one file, without the continual rounds."""
    cfg, _ = afconfig.load_configs([REPO / "tests/e2e/config.yaml"])
    cfg.pop("continual")
    cfg.update(extra)
    path = tmp_path / "lineage.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def test_a_standalone_file_reads_nothing_under_it(tmp_path):
    path = _standalone(tmp_path, merge_over=None)
    cfg, files = afconfig.load_configs([path])
    assert files == [str(path)] and "continual" not in cfg
    merged, files = afconfig.load_configs([_standalone(tmp_path)])
    assert files[0] == str(REPO / "config/config.yaml") and "continual" in merged


def test_merge_over_names_another_file_and_overrides_come_last(tmp_path):
    under = _standalone(tmp_path, merge_over=None)
    over = tmp_path / "over.yaml"
    over.write_text(f"merge_over: {under}\npools: {{math_r1: {{n: 7}}}}\n")  # absolute: kept
    cfg, files = afconfig.load_configs([over], ["results_dir=/tmp/x"])
    assert files == [str(under), str(over)]
    assert cfg["pools"]["math_r1"]["n"] == 7 and cfg["pools"]["math_r2"]["n"] == 48
    assert cfg["results_dir"] == "/tmp/x" and "continual" not in cfg


def _dry_run(tmp_path: Path, configfile: Path) -> set[str]:
    cmd = [sys.executable, "-m", "snakemake", "-n", "--cores", "2", "--configfile"]
    cmd += [str(configfile), "--config", f"results_dir={tmp_path / 'r'}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {rule for rule, _ in planned_jobs(proc)}


def test_snakemake_plans_a_standalone_lineage_without_the_default_rounds(tmp_path):
    """config.yaml's continual rounds (rule round_status, target rounds/r5.json) come back as
    soon as the file merges over it."""
    assert "round_status" not in _dry_run(tmp_path, _standalone(tmp_path, merge_over=None))
    assert "round_status" in _dry_run(tmp_path, _standalone(tmp_path))


def test_the_config_cli_reads_a_standalone_file(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "arenaflow.config", str(_standalone(tmp_path, merge_over=None))],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "r4-nominee" not in proc.stdout and "B3: init=R2d" in proc.stdout
