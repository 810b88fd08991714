"""arenaflow.stats: exact McNemar p, paired counts and the bootstrap CI."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np
import pytest

from arenaflow import stats


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
        (22, 11, 0.080),  # seeds: "22/11 p=.080"
        (20, 14, 0.39),
        (16, 15, 1.00),
    ],
)
def test_mcnemar_exact_matches_binomial_sum_and_published_rounding(wins, losses, published):
    p = stats.mcnemar_exact(wins, losses)
    assert p == pytest.approx(binomial_two_sided(wins, losses), rel=1e-9)
    digits = len(str(published).split(".")[1])
    assert round(p, digits) == pytest.approx(published)


@pytest.mark.parametrize("wins, losses", [(9, 6), (0, 3), (3, 0), (1, 0), (5, 5), (12, 30), (40, 41)])
def test_mcnemar_exact_matches_binomial_sum(wins, losses):
    assert stats.mcnemar_exact(wins, losses) == pytest.approx(binomial_two_sided(wins, losses), rel=1e-9)


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
