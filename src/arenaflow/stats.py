"""Paired statistics of two arms read out on the same items (scipy, nothing hand-rolled).

delta is in accuracy points (percent). wins = items the candidate gets right and the reference
gets wrong ("fixed"), losses the reverse ("lost"). The p-value is the exact two-sided McNemar
test, i.e. a binomial test of wins against wins + losses at 1/2.
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def mcnemar_exact(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p from discordant counts alone (works on published W/L)."""
    n = wins + losses
    return 1.0 if n == 0 else float(stats.binomtest(wins, n, 0.5).pvalue)


def bootstrap_ci(diff: np.ndarray, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile-free BCa bootstrap CI of the mean paired difference, in points."""
    if len(diff) < 2 or np.all(diff == diff[0]):
        return (float(diff.mean() * 100), float(diff.mean() * 100)) if len(diff) else (0.0, 0.0)
    res = stats.bootstrap((diff,), np.mean, confidence_level=level, n_resamples=2000,
                          random_state=np.random.default_rng(seed), method="BCa")
    return float(res.confidence_interval.low * 100), float(res.confidence_interval.high * 100)


def paired(cand: np.ndarray, ref: np.ndarray, seed: int = 0) -> dict:
    """Paired comparison of two 0/1 correctness vectors over the same items."""
    cand, ref = np.asarray(cand, dtype=bool), np.asarray(ref, dtype=bool)
    if cand.shape != ref.shape:
        raise ValueError(f"paired vectors differ in length: {cand.shape} vs {ref.shape}")
    wins = int(np.sum(cand & ~ref))
    losses = int(np.sum(~cand & ref))
    diff = cand.astype(float) - ref.astype(float)
    lo, hi = bootstrap_ci(diff, seed)
    return {
        "n": int(len(cand)),
        "accuracy": float(cand.mean() * 100) if len(cand) else 0.0,
        "ref_accuracy": float(ref.mean() * 100) if len(ref) else 0.0,
        "delta": float(diff.mean() * 100) if len(diff) else 0.0,
        "wins": wins,
        "losses": losses,
        "wins_minus_losses": wins - losses,
        "ties_pass": int(np.sum(cand & ref)),
        "ties_fail": int(np.sum(~cand & ~ref)),
        "p_value": mcnemar_exact(wins, losses),
        "ci95": [lo, hi],
    }
