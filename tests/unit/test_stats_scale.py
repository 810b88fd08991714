"""arenaflow.evals.stats at scale: the bootstrap's batched resamples are numpy's and scipy's own
(same stream, same interval to the bit), and a paired comparison needs memory linear in n."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest
from scipy import stats as scipy_stats

from arenaflow.evals import stats


def scipy_ci(diff: np.ndarray, seed: int) -> tuple[float, float]:
    """Oracle: the interval as scipy.stats.bootstrap computes it (the n^2-memory original)."""
    res = scipy_stats.bootstrap(
        (diff,),
        np.mean,
        n_resamples=stats.N_RESAMPLES,
        random_state=np.random.default_rng(seed),
        method="BCa",
    )
    return float(res.confidence_interval.low * 100), float(res.confidence_interval.high * 100)


def diffs(n: int, seed: int, tie_share: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    d = (rng.integers(0, 3, n) - 1).astype(float)
    d[rng.random(n) < tie_share] = 0.0
    return d


@pytest.mark.parametrize("n", [2, 3, 153, 10**6 + 3, 2**31 + 1, 2**32 - 5])
def test_batched_draws_are_generator_integers_stream(n):
    # 2**31 + 1 rejects about half of the 32-bit draws: every rejection must be skipped in order
    expected = np.random.default_rng(4).integers(0, n, 3 * stats._BATCH)
    batches, got = stats._draws(np.random.default_rng(4), n), []
    while sum(map(len, got)) < len(expected):
        idx, rejected = next(batches)
        got.append(np.delete(idx, rejected))
    assert np.array_equal(np.concatenate(got)[: len(expected)], expected)


def test_resample_sums_cross_batches_inside_one_resample():
    n = 100_003  # > _BATCH: batches that fall inside one resample, with rejected draws zeroed
    signs = diffs(n, 0).astype(np.int8)
    expected = signs[np.random.default_rng(5).integers(0, n, (3, n))].sum(axis=1)
    assert np.array_equal(stats._resample_sums(signs, 3, np.random.default_rng(5)), expected)


@pytest.mark.parametrize("batch", [64, 1 << 15])
@pytest.mark.parametrize(
    "n, seed, ties",
    [(2, 0, 0.0), (5, 1, 0.0), (40, 3, 0.5), (153, 0, 0.9), (600, 7, 0.8)],
)
def test_bootstrap_ci_is_scipys_interval_to_the_bit(monkeypatch, batch, n, seed, ties):
    monkeypatch.setattr(stats, "_BATCH", batch)  # 64: many batches per resample, as at 10^6
    d = diffs(n, seed, ties)
    if np.all(d == d[0]):
        d[0] = 1.0 - d[0]
    assert stats.bootstrap_ci(d, seed) == scipy_ci(d, seed)


def test_paired_on_many_items_agrees_with_scipy_and_statsmodels():
    from statsmodels.stats.contingency_tables import mcnemar

    rng = np.random.default_rng(11)
    ref = rng.random(2000) < 0.6
    cand = np.where(rng.random(2000) < 0.2, rng.random(2000) < 0.65, ref)
    r = stats.paired(cand, ref, seed=3)
    t = scipy_stats.ttest_rel(cand.astype(float), ref.astype(float))
    assert (r["t_items"], r["t_items_p_value"]) == pytest.approx((t.statistic, t.pvalue), 1e-12)
    table = [[r["ties_pass"], r["wins"]], [r["losses"], r["ties_fail"]]]
    assert r["p_value"] == pytest.approx(mcnemar(table, exact=True).pvalue, rel=1e-12)
    assert r["p_value"] == pytest.approx(
        scipy_stats.binomtest(r["wins"], r["wins"] + r["losses"]).pvalue, rel=1e-12
    )
    assert r["ci95"] == list(scipy_ci(cand.astype(float) - ref.astype(float), 3))


@pytest.mark.parametrize("exact_stream", [True, False])
def test_paired_memory_is_linear_in_items(monkeypatch, exact_stream):
    # scipy's BCa holds an n x (n-1) jackknife matrix: 320 GB of floats at n = 2e5, and its
    # resamples another n_resamples x n. Fewer resamples keep this test fast: the batches' memory
    # does not depend on how many there are.
    monkeypatch.setattr(stats, "N_RESAMPLES", 50)
    monkeypatch.setattr(stats, "EXACT_STREAM_MAX_N", 10**6 if exact_stream else 0)
    n = 200_000
    rng = np.random.default_rng(0)
    cand, ref = rng.random(n) < 0.6, rng.random(n) < 0.55
    tracemalloc.start()
    try:
        r = stats.paired(cand, ref)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r["n"] == n and r["ci95"][0] < r["delta"] < r["ci95"][1]
    assert peak < 80 * n  # bytes: a handful of float vectors of n, nothing of n^2 or 2000 x n


def test_above_the_exact_stream_the_multinomial_resamples_follow_the_same_law():
    """The two ways of drawing the resamples' sums (scipy's index stream, the multinomial counts)
    are samples of one law: a two-sample KS test does not tell them apart, and the BCa intervals
    they give agree to within the bootstrap's own Monte Carlo error."""
    rng = np.random.default_rng(3)
    signs = rng.choice(np.array([-1, 0, 1], np.int8), size=5000, p=[0.1, 0.75, 0.15])
    exact = stats._resample_sums(signs, 4000, np.random.default_rng(0))
    law = stats._multinomial_sums(signs, 4000, np.random.default_rng(1))
    assert scipy_stats.ks_2samp(exact, law).pvalue > 0.001
    lo_e, hi_e = stats._bca(exact, signs, 0.95)
    lo_l, hi_l = stats._bca(law, signs, 0.95)
    assert abs(lo_e - lo_l) < 0.003 and abs(hi_e - hi_l) < 0.003  # the CI is ~0.02 wide


def test_a_million_items_take_the_multinomial_path_in_well_under_a_second():
    n = 10**6
    assert n > stats.EXACT_STREAM_MAX_N
    cand = np.zeros(n, bool)
    cand[: n // 50] = True
    t0 = time.process_time()
    out = stats.paired(cand, np.zeros(n, bool))
    assert time.process_time() - t0 < 3.0
    lo, hi = out["ci95"]
    assert lo < out["delta"] < hi and hi - lo < 0.1
