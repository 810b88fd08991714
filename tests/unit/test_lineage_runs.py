"""benchmarks/lineage_runs.py reads lineage_gpu.py's reports as they came back from the H200
(runs 63-67 of docs/benchmark-log.md: two fused runs, three with grouped LoRA). Its numbers
must be the ones read off those runs by hand for BENCHMARKS.md's table, its test scipy's on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy.stats import mannwhitneyu

REPO = Path(__file__).resolve().parents[2]
RUNS = [REPO / f"benchmarks/results/lineage_gpu-2026-12-05-run{n}.json" for n in range(63, 68)]
GROUPED = "train_defaults.grouped_lora=True"
# docs/benchmark-log.md, runs 63-67: R220's median step and own busy fraction
BY_HAND = {
    63: (0.134, 0.60),
    64: (0.153, 0.54),
    65: (0.151, 0.62),
    66: (0.196, 0.46),
    67: (0.136, 0.72),
}


@pytest.fixture
def runs(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import lineage_runs

    return lineage_runs


def test_each_runs_row_is_what_was_read_off_it_by_hand(runs):
    rows = [runs.run_row(p, json.loads(p.read_text()), None) for p in RUNS]
    assert [r["arm"] for r in rows] == ["arm=R220"] * 5  # the slowest arm in every run
    for n, r in zip(range(63, 68), rows):
        step, busy = BY_HAND[n]
        assert r["step_s"] == pytest.approx(step, abs=5e-4), n
        assert r["busy_own"] == pytest.approx(busy, abs=5e-3), n
        assert r["variant"] == (GROUPED if n in (64, 65, 67) else runs.DEFAULT_VARIANT)
        # run 66 missed the busy and tokens/s targets through R220, the others met all three
        assert r["met"] == {t: n != 66 or t == "dag_wall" for t in runs.TARGETS}


def test_the_variants_step_times_are_compared_as_scipy_compares_them(runs, tmp_path, capsys):
    out = tmp_path / "runs.json"
    runs.main([*map(str, RUNS), "--arm", "arm=R220", "--json", str(out)])
    got = json.loads(out.read_text())
    fused = [BY_HAND[n][0] for n in (63, 66)]
    grouped = [BY_HAND[n][0] for n in (64, 65, 67)]
    want = mannwhitneyu(fused, grouped)
    assert got["step_s_test"]["p"] == pytest.approx(want.pvalue)
    assert got["step_s_test"]["U"] == want.statistic
    assert got["variants"][GROUPED]["step_s"] == pytest.approx(0.151, abs=5e-4)
    assert got["variants"][GROUPED]["all_met"] == 3
    assert got["variants"][runs.DEFAULT_VARIANT]["all_met"] == 1
    printed = capsys.readouterr().out
    assert "| lineage_gpu-2026-12-05-run66 | a7a696e | as configured | 130.4 s |" in printed


def test_an_arm_the_run_did_not_train_is_named_with_the_file(runs):
    with pytest.raises(SystemExit, match=r"run63\.json: 0 train_arm jobs with wildcards 'arm=R9'"):
        runs.main([str(RUNS[0]), "--arm", "arm=R9"])
