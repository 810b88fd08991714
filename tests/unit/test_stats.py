"""arenaflow.evals.stats against scipy/statsmodels, exact arithmetic and the reference lineages'
published numbers (docs/lineages.md)."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np
import pytest
from scipy import stats as scipy_stats

from arenaflow.evals import stats


def binomial_two_sided(wins: int, losses: int) -> float:
    """Oracle: 2 * P(X <= min(w, l)) for X ~ Bin(w + l, 1/2), capped at 1, in exact arithmetic."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = Fraction(sum(comb(n, i) for i in range(min(wins, losses) + 1)), 2**n)
    return float(min(Fraction(1), 2 * tail))


@pytest.mark.parametrize(
    "wins, losses, published",
    [
        (22, 11, 0.080),  # docs/lineages.md#000-the-lr-sweep: "22/11 p=.080"
        (20, 14, 0.39),
        (16, 15, 1.00),
    ],
)
def test_mcnemar_exact_matches_binomial_sum_and_published_rounding(wins, losses, published):
    p = stats.mcnemar_exact(wins, losses)
    assert p == pytest.approx(binomial_two_sided(wins, losses), rel=1e-9)
    digits = len(str(published).split(".")[1])
    assert round(p, digits) == pytest.approx(published)


@pytest.mark.parametrize(
    "wins, losses", [(9, 6), (0, 3), (3, 0), (1, 0), (5, 5), (12, 30), (40, 41)]
)
def test_mcnemar_exact_matches_binomial_sum(wins, losses):
    assert stats.mcnemar_exact(wins, losses) == pytest.approx(
        binomial_two_sided(wins, losses), rel=1e-9
    )


def test_mcnemar_9_6_hand_computed():
    # 2 * (C(15,0)+...+C(15,6)) / 2^15 = 2 * 9949 / 32768
    assert sum(comb(15, i) for i in range(7)) == 9949
    assert stats.mcnemar_exact(9, 6) == pytest.approx(2 * 9949 / 32768, rel=1e-12)


def test_mcnemar_is_symmetric_in_wins_and_losses():
    for w, l in [(22, 11), (9, 6), (0, 7), (13, 2)]:
        assert stats.mcnemar_exact(w, l) == pytest.approx(stats.mcnemar_exact(l, w), rel=1e-12)


def test_mcnemar_without_discordant_pairs_is_one():
    assert stats.mcnemar_exact(0, 0) == 1.0


def test_paired_counts_on_hand_made_vectors():
    #        item: 0  1  2  3  4  5
    cand = np.array([1, 1, 0, 0, 1, 0])
    ref = np.array([1, 0, 1, 0, 0, 0])
    # wins (cand right, ref wrong): items 1, 4; losses: item 2; both right: 0; both wrong: 3, 5
    r = stats.paired(cand, ref)
    assert r["n"] == 6
    assert (r["wins"], r["losses"], r["ties_pass"], r["ties_fail"]) == (2, 1, 1, 2)
    assert r["wins_minus_losses"] == 1
    assert r["accuracy"] == pytest.approx(100 * 3 / 6)
    assert r["ref_accuracy"] == pytest.approx(100 * 2 / 6)
    assert r["delta"] == pytest.approx(100 * (3 - 2) / 6)
    # 2 wins vs 1 loss: 2 * (C(3,0) + C(3,1)) / 8 = 1.0
    assert r["p_value"] == pytest.approx(1.0)


def test_paired_delta_equals_wins_minus_losses_over_n():
    rng = np.random.default_rng(7)
    cand, ref = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
    r = stats.paired(cand, ref)
    assert r["wins"] + r["losses"] + r["ties_pass"] + r["ties_fail"] == 50
    assert r["delta"] == pytest.approx(100 * (r["wins"] - r["losses"]) / 50)
    assert r["delta"] == pytest.approx(r["accuracy"] - r["ref_accuracy"])
    assert r["p_value"] == pytest.approx(binomial_two_sided(r["wins"], r["losses"]), rel=1e-9)


def test_paired_rejects_vectors_of_different_length():
    with pytest.raises(ValueError, match="differ in length"):
        stats.paired(np.ones(3), np.ones(4))


def _diff_vector(wins: int, losses: int, ties: int) -> np.ndarray:
    return np.array([1.0] * wins + [-1.0] * losses + [0.0] * ties)


def test_bootstrap_ci_contains_delta():
    diff = _diff_vector(22, 11, 67)  # delta = 11 points
    lo, hi = stats.bootstrap_ci(diff, seed=0)
    assert lo < 11.0 < hi
    assert -100 <= lo and hi <= 100


def test_bootstrap_ci_is_deterministic_for_a_seed():
    diff = _diff_vector(9, 6, 30)
    assert stats.bootstrap_ci(diff, seed=5) == stats.bootstrap_ci(diff, seed=5)


def test_bootstrap_ci_of_constant_difference_is_the_point():
    assert stats.bootstrap_ci(np.full(10, 1.0)) == (100.0, 100.0)
    assert stats.bootstrap_ci(np.zeros(10)) == (0.0, 0.0)


def test_paired_ci_contains_delta_and_repeats_for_same_seed():
    cand = np.array([1] * 22 + [0] * 11 + [1] * 40 + [0] * 27)
    ref = np.array([0] * 22 + [1] * 11 + [1] * 40 + [0] * 27)
    a, b = stats.paired(cand, ref, seed=3), stats.paired(cand, ref, seed=3)
    assert a["ci95"] == b["ci95"]
    lo, hi = a["ci95"]
    assert lo < a["delta"] < hi
    assert a["delta"] == pytest.approx(11.0)
    assert a["p_value"] == pytest.approx(binomial_two_sided(22, 11), rel=1e-9)


# --- McNemar = sign test, against statsmodels ---------------------------------------------


@pytest.mark.parametrize(
    "wins, losses, ties_pass, ties_fail",
    [(22, 11, 540, 27), (9, 6, 0, 0), (0, 4, 3, 3), (151, 79, 1184, 186)],
)
def test_mcnemar_and_sign_test_agree_with_statsmodels(wins, losses, ties_pass, ties_fail):
    from statsmodels.stats.contingency_tables import mcnemar
    from statsmodels.stats.descriptivestats import sign_test

    table = [[ties_pass, wins], [losses, ties_fail]]
    expected = mcnemar(table, exact=True).pvalue
    assert stats.mcnemar_exact(wins, losses) == pytest.approx(expected, rel=1e-12)
    diff = _diff_vector(wins, losses, ties_pass + ties_fail)
    assert stats.sign_test(diff) == pytest.approx(sign_test(diff, 0)[1], rel=1e-12)
    assert stats.sign_test(diff) == pytest.approx(expected, rel=1e-12)


def test_sign_test_on_numeric_differences_counts_signs_only():
    from statsmodels.stats.descriptivestats import sign_test

    words = np.array([40.0, 3, -2, 0, 0, 17, 1, -1, 9])  # 5 up, 2 down, 2 tied
    assert stats.sign_test(words) == pytest.approx(stats.mcnemar_exact(5, 2))
    assert stats.sign_test(words) == pytest.approx(sign_test(words, 0)[1], rel=1e-12)


# --- the published W/L of docs/lineages.md, checked from counts alone --------------------


@pytest.mark.parametrize(
    "wins, losses, published, where",
    [
        (22, 11, "0.080", "000: B3 vs R2d greedy, 22/11 p=.080"),
        (20, 14, "0.39", "000: B1, 20/14 p=.39"),
        (16, 15, "1.00", "000: as served, 16/15 p=1.00"),
        (151, 79, "2.4e-06", "002: H6-1600, 151 fixed / 79 lost, sign test p = 2.4e-06"),
        (19, 13, "0.377", "002: blinded read, 19 vs 13 preferred, p = 0.377"),
        (5, 4, "1.000", "002: open chat, 5 fixed / 4 lost"),
        (6, 4, "0.754", "002: vs an older checkpoint, 6/4"),
        (102, 83, "0.186", "002: probe2-1200, 102/83"),
        (13, 20, "0.296", "002: grid v741"),
        (14, 20, "0.392", "002: grid v742"),
        (17, 19, "0.868", "002: grid v743"),
        (18, 17, "1.000", "002: grid v744"),
        (9, 14, "0.405", "002: grid v745"),
        (6, 7, "1.000", "002: grid v746"),
        (20, 16, "0.618", "002: grid v747"),
        (15, 18, "0.728", "002: grid v748"),
        (37, 36, "1.000", "002: grid v749"),
    ],
)
def test_from_counts_reproduces_published_p_values(wins, losses, published, where):
    r = stats.from_counts(wins, losses)
    assert (r["wins"], r["losses"], r["discordant"], r["wins_minus_losses"]) == (
        wins,
        losses,
        wins + losses,
        wins - losses,
    )
    assert r["p_value"] == pytest.approx(binomial_two_sided(wins, losses), rel=1e-9)
    if "e" in published:
        mantissa, exp = published.split("e")
        assert f"{r['p_value']:.1e}" == f"{float(mantissa):.1f}e{exp}", where
    else:
        assert f"{r['p_value']:.{len(published.split('.')[1])}f}" == published, where


def test_from_counts_flags_a_published_p_that_does_not_reproduce():
    # docs/lineages.md#002-headline-reads: pooled 139 fixed against 119 lost, "about p = 0.19".
    # The exact two-sided sign test gives 0.237: the card's "about 0.19" is not this test.
    r = stats.from_counts(139, 119)
    assert r["p_value"] == pytest.approx(0.2368, abs=5e-4)
    assert round(r["p_value"], 2) != 0.19


def test_from_counts_with_n_gives_delta_and_the_paired_t_over_items():
    r = stats.from_counts(22, 11, n=600)
    assert r["delta"] == pytest.approx(
        100 * 11 / 600
    )  # docs/lineages.md#000-the-lr-sweep: +1.83 pt on 600
    assert round(r["delta"], 2) == 1.83
    diff = _diff_vector(22, 11, 600 - 33)
    ref = scipy_stats.ttest_1samp(diff, 0.0)
    assert r["t_items"] == pytest.approx(ref.statistic, rel=1e-12)
    assert r["t_items_p_value"] == pytest.approx(ref.pvalue, rel=1e-12)
    # hand-computed: mean 11/600, E[d^2] = 33/600, s^2 = (33/600 - (11/600)^2) * 600/599
    mean, s2 = 11 / 600, (33 / 600 - (11 / 600) ** 2) * 600 / 599
    assert r["t_items"] == pytest.approx(mean / (s2**0.5 / 600**0.5), rel=1e-12)


def test_from_counts_rejects_impossible_counts():
    with pytest.raises(ValueError, match="smaller than wins"):
        stats.from_counts(10, 5, n=12)
    with pytest.raises(ValueError, match=">= 0"):
        stats.from_counts(-1, 5)


# --- t statistics --------------------------------------------------------------------------


def test_paired_t_items_is_scipy_ttest_rel():
    rng = np.random.default_rng(3)
    cand, ref = rng.integers(0, 2, 80), rng.integers(0, 2, 80)
    r = stats.paired(cand, ref)
    ref_t = scipy_stats.ttest_rel(cand.astype(float), ref.astype(float))
    assert r["t_items"] == pytest.approx(ref_t.statistic, rel=1e-12)
    assert r["t_items_p_value"] == pytest.approx(ref_t.pvalue, rel=1e-12)


def test_t_is_none_where_undefined():
    assert stats.paired(np.ones(5), np.ones(5))["t_items"] is None  # no difference at all
    assert stats.paired(np.ones(5), np.zeros(5))["t_items"] is None  # constant difference
    assert stats.t_one_sample([1.5]) == (None, None)
    assert stats.t_over_replicates([50.0], [48.0])["t"] is None  # K = 1
    assert stats.t_over_replicates([50.0, 51.0], [48.0, 49.0])["t"] is None  # constant deltas


def _acc(correct: int, n: int = 153) -> float:
    """An accuracy in points as evals computes it: the mean of a 0/1 vector, times 100."""
    return float(np.mean([1] * correct + [0] * (n - correct)) * 100)


def test_t_over_replicates_is_none_for_deltas_equal_up_to_float_rounding():
    # a blind-review case: one item better out of 153 in both replicates. The deltas differ in the
    # 14th digit, and scipy's t on them is 9.2e13 (p 7e-15): a bar on t would pass on it.
    cand, ref = [_acc(101), _acc(103)], [_acc(100), _acc(102)]
    deltas = np.subtract(cand, ref)
    assert deltas[0] != deltas[1] and abs(deltas[0] - deltas[1]) < 1e-12
    assert abs(scipy_stats.ttest_rel(cand, ref).statistic) > 1e13
    r = stats.t_over_replicates(cand, ref)
    assert (r["t"], r["t_p_value"], r["t_df"]) == (None, None, 1)
    assert stats.t_one_sample([0.5, 0.5 + 1e-9]) == (None, None)
    # a real difference, however small, is still tested
    assert stats.t_one_sample([0.5, 0.5 + 1e-6, 0.5 + 3e-6])[0] == pytest.approx(
        scipy_stats.ttest_1samp([0.5, 0.5 + 1e-6, 0.5 + 3e-6], 0).statistic, rel=1e-9
    )


@pytest.mark.parametrize(
    "bad, shown",
    [
        ([1, np.nan, 0], "nan at position 1"),
        ([1, 0, 2], "2 at position 2"),
        (np.array([True, None, False], dtype=object), "None at position 1"),
        (np.array(["1", "0", "1"]), "'1' at position 0"),
        ([1, 0, -1], "-1 at position 2"),
    ],
)
def test_paired_refuses_outcomes_that_are_not_0_or_1_naming_the_readout(bad, shown):
    # bool(nan) is True, so a NaN outcome used to count as correct
    with pytest.raises(
        ValueError, match=r"^readouts/x\.parquet: \d of 3 outcomes are not 0/1, e\.g\. " + shown
    ):
        stats.paired(bad, [1, 0, 0], names=("readouts/x.parquet", "readouts/y.parquet"))
    with pytest.raises(ValueError, match="^readouts/y.parquet: "):
        stats.paired([1, 0, 0], bad, names=("readouts/x.parquet", "readouts/y.parquet"))
    with pytest.raises(ValueError, match="^candidate: "):
        stats.paired(bad, [1, 0, 0])


def test_paired_accepts_bools_ints_and_floats_of_0_and_1():
    for cand in (
        [True, False, True],
        [1, 0, 1],
        [1.0, 0.0, 1.0],
        np.array([1, 0, 1], dtype=object),
    ):
        assert stats.paired(cand, [0, 0, 1])["wins"] == 1


def test_noise_floor_refuses_a_nan_outcome_naming_it():
    mat = np.array([[1, 0, 1], [1, np.nan, 1]])
    with pytest.raises(
        ValueError,
        match=r"^noise/R2d\.json: 1 of 6 outcomes are not 0/1, e\.g\. nan at position \(1, 1\)",
    ):
        stats.noise_floor(mat, name="noise/R2d.json")


def test_t_over_replicates_is_ttest_rel_of_replicate_accuracies():
    cand, ref = [84.31, 83.01, 80.39], [82.35, 83.66, 79.08]
    r = stats.t_over_replicates(cand, ref)
    ref_t = scipy_stats.ttest_rel(cand, ref)
    assert r["t"] == pytest.approx(ref_t.statistic, rel=1e-12)
    assert r["t_p_value"] == pytest.approx(ref_t.pvalue, rel=1e-12)
    assert r["t_df"] == 2
    deltas = np.subtract(cand, ref)
    assert r["t"] == pytest.approx(scipy_stats.ttest_1samp(deltas, 0).statistic, rel=1e-12)
    # by hand: mean / (sd / sqrt(K))
    assert r["t"] == pytest.approx(deltas.mean() / (deltas.std(ddof=1) / 3**0.5), rel=1e-12)
    assert r["replicate_deltas"] == pytest.approx(list(deltas))


# --- noise floor: block 112 of docs/lineages.md#000-the-noise-floor -------------------------


def test_noise_from_published_accuracies_reproduces_spread_and_mean_abs_delta():
    r = stats.noise_from_accuracies([84.31, 83.01, 80.39])  # ".8431 / .8301 / .8039"
    assert round(r["spread"], 2) == 3.92
    assert round(r["mean_abs_delta"], 2) == 2.61
    assert "max_abs_t" not in r  # not determined by accuracies
    exact = stats.noise_from_accuracies([100 * 129 / 153, 100 * 127 / 153, 100 * 123 / 153])
    assert exact["spread"] == pytest.approx(100 * 6 / 153)
    assert exact["mean_abs_delta"] == pytest.approx(100 * (2 + 6 + 4) / 3 / 153)
    assert exact["max_abs_delta"] == pytest.approx(100 * 6 / 153)


def block_112() -> np.ndarray:
    """3 replicates x 153 items with 129/127/123 correct; replicates 0 vs 2 discord 8/2."""
    r0 = np.zeros(153, bool)
    r0[:129] = True
    r2 = r0.copy()
    r2[121:129] = False  # 8 items r0 gets right, r2 wrong
    r2[129:131] = True  # 2 items r2 gets right, r0 wrong -> 123 correct
    r1 = r0.copy()
    r1[:2] = False  # 127 correct; vs r0: 0/2, vs r2: 8/4
    return np.vstack([r0, r1, r2])


def test_noise_floor_reproduces_block_112_including_max_abs_t():
    mat = block_112()
    assert mat.sum(axis=1).tolist() == [129, 127, 123]
    r = stats.noise_floor(mat)
    assert (r["k"], r["n"]) == (3, 153)
    assert [round(a / 100, 4) for a in r["replicate_accuracies"]] == [0.8431, 0.8301, 0.8039]
    assert round(r["spread"], 2) == 3.92 and round(r["mean_abs_delta"], 2) == 2.61
    assert round(r["max_abs_t"], 2) == 1.91
    for p in r["pairs"]:
        expected = scipy_stats.ttest_rel(
            mat[p["a"]].astype(float), mat[p["b"]].astype(float)
        ).statistic
        assert p["t_items"] == pytest.approx(expected, rel=1e-12)
    assert max(abs(p["t_items"]) for p in r["pairs"]) == r["max_abs_t"]


def test_published_max_abs_t_needs_counts_and_only_8_2_on_the_widest_pair_gives_it():
    # Which discordant counts (W, L) can give |t| = 1.91 (to 2 decimals) for a pair of these
    # replicates? W - L is fixed by the accuracies (2, 4 or 6 items of 153).
    hits = [
        (d, l + d, l)
        for d in (2, 4, 6)
        for l in range(0, 60)
        if round(stats.from_counts(l + d, l, n=153)["t_items"], 2) == 1.91
    ]
    assert hits == [(6, 8, 2)]


def test_noise_floor_of_identical_replicates_has_no_t():
    mat = np.vstack([block_112()[0]] * 3)  # greedy decoding: every replicate the same
    r = stats.noise_floor(mat)
    assert r["spread"] == 0 and r["mean_abs_delta"] == 0 and r["max_abs_t"] is None


def test_noise_floor_needs_two_replicates():
    with pytest.raises(ValueError, match="K >= 2"):
        stats.noise_floor(np.ones((1, 10)))


# --- bad input: refused with an error naming the readout or the argument --------------------

NAMES = ("readouts/B3.r0.parquet", "readouts/R2d.r0.parquet")
ONE = "readouts/B3.r0.parquet"


@pytest.mark.parametrize(
    "cand, ref, message",
    [
        ([1, 0, 1], [1, 0], r"^readouts/B3\.r0\.parquet vs readouts/R2d\.r0\.parquet: .*differ"),
        ([], [], r"^readouts/B3\.r0\.parquet: no outcomes"),
        ([1, 0], [], r"^readouts/R2d\.r0\.parquet: no outcomes"),
        (
            [[1, 0], [0, 1]],
            [1, 0],
            r"^readouts/B3\.r0\.parquet: outcomes must be one per item.*2, 2",
        ),
        ([1, 0], [[1, 0]], r"^readouts/R2d\.r0\.parquet: outcomes must be one per item"),
        (
            [1, np.inf],
            [1, 0],
            r"^readouts/B3\.r0\.parquet: 1 of 2 outcomes are not 0/1, e\.g\. inf",
        ),
        ([1, 0.5], [1, 0], r"^readouts/B3\.r0\.parquet: 1 of 2 outcomes are not 0/1, e\.g\. 0\.5"),
    ],
)
def test_paired_refuses_bad_vectors_naming_the_readouts(cand, ref, message):
    with pytest.raises(ValueError, match=message):
        stats.paired(cand, ref, names=NAMES)


@pytest.mark.parametrize(
    "values, message",
    [
        ([0.5, np.nan, 1.0], r"1 of 3 values are not finite numbers, e\.g\. nan at position 1"),
        ([0.5, -np.inf], r"1 of 2 values are not finite numbers, e\.g\. -inf at position 1"),
        (np.array([1.0, None], dtype=object), r"1 of 2 values .* e\.g\. None at position 1"),
        ([], r"no values"),
        ([[1.0, 2.0]], r"values must be one per item \(a 1-D array\), got shape \(1, 2\)"),
    ],
)
@pytest.mark.parametrize("fn", [stats.t_one_sample, stats.sign_test])
def test_t_and_sign_test_refuse_nan_inf_empty_and_2d_naming_the_input(fn, values, message):
    with pytest.raises(ValueError, match=rf"^{ONE}: {message}"):
        fn(values, ONE)


@pytest.mark.parametrize(
    "cand, ref, message",
    [
        ([84.3, np.nan], [82.3, 83.6], r"^cmp\.json: candidate: 1 of 2 replicate accuracies are "),
        ([84.3, 83.0], [82.3, np.inf], r"^cmp\.json: reference: 1 of 2 replicate accuracies are "),
        ([], [], r"^cmp\.json: candidate: no replicate accuracies"),
        ([84.3, 83.0], [82.3], r"^cmp\.json: replicate counts differ: 2 candidate vs 1"),
        (
            [[84.3, 83.0]],
            [[82.3, 83.6]],
            r"^cmp\.json: candidate: replicate accuracies must be one",
        ),
    ],
)
def test_t_over_replicates_refuses_nan_and_bad_shapes_naming_the_compare(cand, ref, message):
    # a NaN replicate accuracy used to give t = None and a NaN among replicate_deltas
    with pytest.raises(ValueError, match=message):
        stats.t_over_replicates(cand, ref, name="cmp.json")


def test_bootstrap_ci_refuses_what_is_not_a_paired_difference_of_outcomes():
    with pytest.raises(ValueError, match=r"^d: paired differences .* -1, 0 or 1, got 0\.5 at"):
        stats.bootstrap_ci([1.0, 0.5, 0.0], name="d")
    with pytest.raises(ValueError, match=r"^d: 1 of 3 differences are not finite .* nan"):
        stats.bootstrap_ci([1.0, np.nan, 0.0], name="d")
    with pytest.raises(ValueError, match=r"^d: no differences"):
        stats.bootstrap_ci([], name="d")
    with pytest.raises(ValueError, match=r"^level must be in \(0, 1\), got 95"):
        stats.bootstrap_ci([1.0, 0.0], level=95)


@pytest.mark.parametrize(
    "mat, message",
    [
        (
            np.ones((3, 0)),
            r"^noise/R2d\.json: a noise floor needs .* N >= 1 items, got shape \(3, 0\)",
        ),
        (np.ones(5), r"^noise/R2d\.json: a noise floor needs a K x N matrix"),
        (np.ones((1, 5)), r"^noise/R2d\.json: .*K >= 2"),
    ],
)
def test_noise_floor_refuses_zero_items_and_wrong_shapes_naming_it(mat, message):
    # over zero items the replicate accuracies used to come out NaN
    with pytest.raises(ValueError, match=message):
        stats.noise_floor(mat, name="noise/R2d.json")


def test_noise_from_accuracies_refuses_nan_naming_it():
    with pytest.raises(ValueError, match=r"^noise/R2d\.json: 1 of 3 replicate accuracies .* nan"):
        stats.noise_from_accuracies([84.3, np.nan, 80.4], name="noise/R2d.json")


@pytest.mark.parametrize(
    "args, message",
    [
        ((2.5, 1), r"^wins must be a count \(an integer >= 0\), got 2\.5"),
        ((2, np.nan), r"^losses must be a count .*, got nan"),
        ((True, 1), r"^wins must be a count"),
        ((2, 1, 0.0), r"^n must be a count"),
        ((0, 0, 0), r"^n must be >= 1 item"),
    ],
)
def test_counts_refuse_what_is_not_a_count_naming_the_argument(args, message):
    with pytest.raises(ValueError, match=message):
        stats.from_counts(*args)
    if len(args) == 2:
        with pytest.raises(ValueError, match=message):
            stats.mcnemar_exact(*args)
