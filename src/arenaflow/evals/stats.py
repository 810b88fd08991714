"""Paired statistics of arms read out on the same items (scipy; nothing hand-rolled).

Conventions, shared by every function here and by compare/noise/nomination JSON:

- Accuracies and deltas are in points (percent). `delta` = candidate - reference.
- wins ("fixed") = items the candidate gets right and the reference wrong; losses ("lost") the
  reverse. Both together are McNemar's discordant pairs.
- `p_value` is the exact two-sided McNemar test: a binomial test of wins against wins + losses at
  1/2. That is the same number as the two-sided exact *sign test* on the per-item differences
  (ties dropped), because with 0/1 outcomes the non-zero differences are exactly the discordant
  pairs; `sign_test` says so in code, and `from_counts` checks published W/L with it.
- `t_items`: the paired t over items, scipy.stats.ttest_rel(cand, ref) on the per-item 0/1
  outcomes (df = n - 1). It is fully determined by (wins, losses, n), so `from_counts` can
  compute it from published counts.
- `t` (over replicates): with K readouts of each arm under distinct seeds, the per-replicate
  accuracy deltas d_r = acc_cand_r - acc_ref_r, paired by replicate index, tested with
  scipy.stats.ttest_rel (= ttest_1samp of the d_r against 0; df = K - 1). It is None for K < 2.
- Every t is None where it is undefined: fewer than two values, or differences with zero
  variance (scipy would return nan or +-inf; JSON has neither, and a bar must not pass on it).
  Differences that agree within EQUAL_WITHIN (1e-9) count as equal: accuracies in points are
  float quotients, so two replicates each one item better out of 153 give deltas that differ
  in the 14th digit, and scipy's t on them is 9e13 (p 7e-15), not "undefined".
- Paired 0/1 outcomes must be 0/1 (or booleans): NaN or any other value raises ValueError
  naming the readout, instead of counting as correct (bool(nan) is True).

    python -c "from arenaflow.evals import stats; print(stats.from_counts(22, 11, n=600))"
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import stats

EQUAL_WITHIN = 1e-9  # differences closer than this are float rounding of equal values


def _finite(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def binary(values, name: str, labels=None) -> np.ndarray:
    """`values` as a bool array; ValueError naming `name` if any is not 0/1 (NaN included), with
    the first offender's position, or its label where `labels` (one per value) are given."""
    arr = np.asarray(values)
    if arr.dtype.kind in "biuf":
        num = arr.astype(float)
    else:  # object columns (None, strings): only numbers can be outcomes
        num = np.vectorize(
            lambda v: float(v) if isinstance(v, (bool, int, float, np.number)) else np.nan,
            otypes=[float],
        )(arr)
    bad = ~np.isin(num, (0.0, 1.0))  # NaN is in neither
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        value = arr[idx].item() if isinstance(arr[idx], np.generic) else arr[idx]
        at = (
            labels[idx[0]] if labels is not None else f"position {idx[0] if len(idx) == 1 else idx}"
        )
        raise ValueError(
            f"{name}: {int(bad.sum())} of {bad.size} outcomes are not 0/1, e.g. {value!r} at {at}"
        )
    return num.astype(bool)


def t_one_sample(diff) -> tuple[float | None, float | None]:
    """(t, two-sided p) of scipy.stats.ttest_1samp(diff, 0); (None, None) where undefined:
    fewer than two values, or all equal within EQUAL_WITHIN."""
    diff = np.asarray(diff, dtype=float)
    if len(diff) < 2 or np.ptp(diff) <= EQUAL_WITHIN:
        return None, None
    res = stats.ttest_1samp(diff, 0.0)
    return _finite(res.statistic), _finite(res.pvalue)


def mcnemar_exact(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p from discordant counts alone (works on published W/L)."""
    n = wins + losses
    return 1.0 if n == 0 else float(stats.binomtest(wins, n, 0.5).pvalue)


def sign_test(diff) -> float:
    """Exact two-sided sign test of paired differences against 0, ties dropped.

    For 0/1 outcomes the positive/negative differences are the wins/losses, so this is
    `mcnemar_exact(wins, losses)`; for numeric measures (e.g. words per answer) it is the
    ordinary sign test (statsmodels.stats.descriptivestats.sign_test gives the same p)."""
    diff = np.asarray(diff, dtype=float)
    return mcnemar_exact(int(np.sum(diff > 0)), int(np.sum(diff < 0)))


def from_counts(wins: int, losses: int, n: int | None = None) -> dict:
    """The comparison from published counts: W/L (and n items, if known).

    Without n: p (exact McNemar = sign test) and W - L. With n: also delta in points and the
    paired t over items, computed by scipy on the per-item differences the counts imply
    (wins x +1, losses x -1, the rest 0)."""
    if min(wins, losses) < 0:
        raise ValueError(f"counts must be >= 0, got wins={wins} losses={losses}")
    out = {
        "wins": int(wins),
        "losses": int(losses),
        "discordant": int(wins + losses),
        "wins_minus_losses": int(wins - losses),
        "p_value": mcnemar_exact(wins, losses),
    }
    if n is not None:
        if n < wins + losses:
            raise ValueError(f"n={n} is smaller than wins + losses = {wins + losses}")
        diff = np.concatenate([np.ones(wins), -np.ones(losses), np.zeros(n - wins - losses)])
        t, tp = t_one_sample(diff)
        out.update(
            n=int(n), delta=100.0 * (wins - losses) / n if n else 0.0, t_items=t, t_items_p_value=tp
        )
    return out


def bootstrap_ci(diff: np.ndarray, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """BCa bootstrap CI (scipy.stats.bootstrap) of the mean paired difference, in points."""
    diff = np.asarray(diff, dtype=float)
    if len(diff) < 2 or np.all(diff == diff[0]):
        return (float(diff.mean() * 100), float(diff.mean() * 100)) if len(diff) else (0.0, 0.0)
    res = stats.bootstrap(
        (diff,),
        np.mean,
        confidence_level=level,
        n_resamples=2000,
        random_state=np.random.default_rng(seed),
        method="BCa",
    )
    return float(res.confidence_interval.low * 100), float(res.confidence_interval.high * 100)


def paired(
    cand: np.ndarray,
    ref: np.ndarray,
    seed: int = 0,
    names: tuple[str, str] = ("candidate", "reference"),
) -> dict:
    """Paired comparison of two 0/1 correctness vectors over the same items; `names` say in an
    error which readouts the vectors are."""
    cand, ref = binary(cand, names[0]), binary(ref, names[1])
    if cand.shape != ref.shape:
        raise ValueError(f"paired vectors differ in length: {cand.shape} vs {ref.shape}")
    wins = int(np.sum(cand & ~ref))
    losses = int(np.sum(~cand & ref))
    diff = cand.astype(float) - ref.astype(float)
    lo, hi = bootstrap_ci(diff, seed)
    # ttest_rel(cand, ref) is ttest_1samp(cand - ref): one helper, one definition of "undefined"
    t, tp = t_one_sample(diff)
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
        "t_items": t,
        "t_items_p_value": tp,
    }


def t_over_replicates(cand_acc, ref_acc) -> dict:
    """Paired t over K replicates: ttest_rel of per-replicate accuracies (points), df = K - 1."""
    cand_acc, ref_acc = np.asarray(cand_acc, dtype=float), np.asarray(ref_acc, dtype=float)
    if cand_acc.shape != ref_acc.shape:
        raise ValueError(f"replicate counts differ: {cand_acc.shape} vs {ref_acc.shape}")
    deltas = cand_acc - ref_acc
    t, p = t_one_sample(deltas)
    return {
        "t": t,
        "t_p_value": p,
        "t_df": int(len(deltas) - 1) if len(deltas) > 1 else None,
        "replicate_deltas": [float(d) for d in deltas],
    }


def noise_from_accuracies(accuracies) -> dict:
    """The part of a noise floor that replicate accuracies (points) alone determine.

    spread = max - min; mean_abs_delta / max_abs_delta over the K(K-1)/2 replicate pairs.
    max |t| is NOT determined by accuracies: it needs each pair's discordant counts (see
    `noise_floor`), so it is not returned here."""
    acc = [float(a) for a in accuracies]
    if len(acc) < 2:
        raise ValueError(f"a noise floor needs >= 2 replicates, got {len(acc)}")
    deltas = [abs(a - b) for a, b in itertools.combinations(acc, 2)]
    return {
        "replicate_accuracies": acc,
        "spread": max(acc) - min(acc),
        "mean_abs_delta": float(np.mean(deltas)),
        "max_abs_delta": float(max(deltas)),
    }


def noise_floor(correct, name: str = "noise floor") -> dict:
    """An arm against itself: K replicate readouts (rows) of the same N items (columns), 0/1.

    For every replicate pair (i < j), the paired comparison of replicate i (as candidate)
    against replicate j: delta, W/L, exact McNemar p and t_items = ttest_rel over the N items.
    max_abs_t = max over pairs of |t_items| (pairs with an undefined t are skipped; None if
    every pair's t is undefined, e.g. identical greedy replicates).

    Reproducing lineage 000's block 112 (".8431/.8301/.8039, spread 3.92 pt, mean |delta| 2.61,
    max |t| 1.91" on 153 problems, i.e. 129/127/123 correct): spread and mean |delta| follow
    from the accuracies (`noise_from_accuracies`). max |t| does not: it needs the pairs'
    discordant counts, which the card does not publish. 1.91 is what from_counts(8, 2, 153)
    gives for the 129-vs-123 pair, and no other pair of these accuracies can reach it
    (tests/unit/test_stats.py enumerates them), so it is consistent with this definition,
    but only reproducible from item-level readouts. See docs/lineages.md#000-the-noise-floor."""
    mat = binary(correct, name)
    if mat.ndim != 2 or mat.shape[0] < 2:
        raise ValueError(f"a noise floor needs a K x N matrix with K >= 2, got shape {mat.shape}")
    out = noise_from_accuracies(mat.mean(axis=1) * 100)
    pairs = []
    for i, j in itertools.combinations(range(mat.shape[0]), 2):
        p = paired(mat[i], mat[j])
        pairs.append(
            {
                "a": i,
                "b": j,
                **{
                    k: p[k]
                    for k in ("delta", "wins", "losses", "p_value", "t_items", "t_items_p_value")
                },
            }
        )
    ts = [abs(p["t_items"]) for p in pairs if p["t_items"] is not None]
    out.update(
        k=int(mat.shape[0]), n=int(mat.shape[1]), pairs=pairs, max_abs_t=max(ts) if ts else None
    )
    return out
