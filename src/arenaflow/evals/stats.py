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
- Every function refuses what it cannot give a number for, with a ValueError naming the readout
  (`name`/`names`) or the argument: an empty input, NaN or inf anywhere, vectors of different
  lengths, a 2-D array where one value per item is meant, a count that is not an integer >= 0.
  So no NaN reaches a compare file, a bar or a card.
- `ci95` is scipy.stats.bootstrap's BCa interval (2000 resamples, seeded), computed here in
  O(n) memory and time: the same resamples as scipy's, drawn in batches (`_resample_sums`), and
  the jackknife of the mean in closed form (`_bca`), so the same numbers to the last bit
  (tests/unit/test_stats_scale.py checks them against scipy's). scipy's own needs n^2 memory
  (an n x n-1 jackknife matrix): 6.7 GiB at 30,000 items; here 10^6 items take ~41 MiB and
  10-20 s of one core, most of it drawing scipy's 2 x 10^9 resampled indices
  (benchmarks/stats_scale.py, docs/benchmark-log.md).

    python -c "from arenaflow.evals import stats; print(stats.from_counts(22, 11, n=600))"
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import stats
from scipy.special import ndtr, ndtri

EQUAL_WITHIN = 1e-9  # differences closer than this are float rounding of equal values
N_RESAMPLES = 2000  # bootstrap resamples of ci95
# Up to this many items the bootstrap draws scipy's own index stream, so its interval is scipy's
# bit for bit (scipy's own could not go much further: its jackknife held an n x n-1 matrix, ~3 GiB
# here); above it the resamples' sums come from their multinomial law: O(resamples), not O(n x
# resamples), 10^6 items in well under a second instead of ~15 s of CPU.
EXACT_STREAM_MAX_N = 20_000
_BATCH = 1 << 15  # bootstrap draws per batch (~0.6 MiB of arrays); 2^14 to 2^17 ran as fast


def _finite(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def _as_float(arr: np.ndarray) -> np.ndarray:
    """`arr` as floats; in object columns (None, strings) anything but a number becomes NaN."""
    if arr.dtype.kind in "biuf":
        return arr.astype(float)
    return np.vectorize(
        lambda v: float(v) if isinstance(v, (bool, int, float, np.number)) else np.nan,
        otypes=[float],
    )(arr)


def _at(idx: tuple, labels) -> str:
    return labels[idx[0]] if labels is not None else f"position {idx[0] if len(idx) == 1 else idx}"


def _shown(arr: np.ndarray, idx: tuple):
    return arr[idx].item() if isinstance(arr[idx], np.generic) else arr[idx]


def _one_per_item(values, name: str, what: str) -> np.ndarray:
    """`values` as an array of one value per item, non-empty; ValueError naming `name` if not."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(
            f"{name}: {what} must be one per item (a 1-D array), got shape {arr.shape}"
        )
    if arr.size == 0:
        raise ValueError(f"{name}: no {what} (an empty array)")
    return arr


def finite(values, name: str, what: str = "values") -> np.ndarray:
    """`values` as a non-empty 1-D float array of finite numbers; ValueError naming `name` and
    the first offender's position if any is NaN, inf or not a number."""
    arr = _one_per_item(values, name, what)
    num = _as_float(arr)
    bad = ~np.isfinite(num)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name}: {int(bad.sum())} of {bad.size} {what} are not finite numbers, "
            f"e.g. {_shown(arr, idx)!r} at {_at(idx, None)}"
        )
    return num


def binary(values, name: str, labels=None) -> np.ndarray:
    """`values` as a bool array; ValueError naming `name` if any is not 0/1 (NaN included), with
    the first offender's position, or its label where `labels` (one per value) are given."""
    arr = np.asarray(values)
    num = _as_float(arr)
    bad = ~np.isin(num, (0.0, 1.0))  # NaN is in neither
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name}: {int(bad.sum())} of {bad.size} outcomes are not 0/1, "
            f"e.g. {_shown(arr, idx)!r} at {_at(idx, labels)}"
        )
    return num.astype(bool)


def count(value, name: str) -> int:
    """`value` as an int; ValueError naming the argument unless it is an integer >= 0."""
    integral = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not integral or value < 0:
        raise ValueError(f"{name} must be a count (an integer >= 0), got {value!r}")
    return int(value)


def t_one_sample(diff, name: str = "differences") -> tuple[float | None, float | None]:
    """(t, two-sided p) of scipy.stats.ttest_1samp(diff, 0); (None, None) where undefined:
    fewer than two values, or all equal within EQUAL_WITHIN."""
    diff = finite(diff, name)
    if len(diff) < 2 or np.ptp(diff) <= EQUAL_WITHIN:
        return None, None
    res = stats.ttest_1samp(diff, 0.0)
    return _finite(res.statistic), _finite(res.pvalue)


def mcnemar_exact(wins: int, losses: int) -> float:
    """Exact two-sided McNemar p from discordant counts alone (works on published W/L)."""
    n = count(wins, "wins") + count(losses, "losses")
    return 1.0 if n == 0 else float(stats.binomtest(int(wins), n, 0.5).pvalue)


def sign_test(diff, name: str = "differences") -> float:
    """Exact two-sided sign test of paired differences against 0, ties dropped.

    For 0/1 outcomes the positive/negative differences are the wins/losses, so this is
    `mcnemar_exact(wins, losses)`; for numeric measures (e.g. words per answer) it is the
    ordinary sign test (statsmodels.stats.descriptivestats.sign_test gives the same p)."""
    diff = finite(diff, name)
    return mcnemar_exact(int(np.sum(diff > 0)), int(np.sum(diff < 0)))


def from_counts(wins: int, losses: int, n: int | None = None) -> dict:
    """The comparison from published counts: W/L (and n items, if known).

    Without n: p (exact McNemar = sign test) and W - L. With n: also delta in points and the
    paired t over items, computed by scipy on the per-item differences the counts imply
    (wins x +1, losses x -1, the rest 0)."""
    wins, losses = count(wins, "wins"), count(losses, "losses")
    out = {
        "wins": int(wins),
        "losses": int(losses),
        "discordant": int(wins + losses),
        "wins_minus_losses": int(wins - losses),
        "p_value": mcnemar_exact(wins, losses),
    }
    if n is not None:
        if count(n, "n") < wins + losses:
            raise ValueError(f"n={n} is smaller than wins + losses = {wins + losses}")
        if n == 0:
            raise ValueError("n must be >= 1 item, got 0")
        diff = np.concatenate([np.ones(wins), -np.ones(losses), np.zeros(n - wins - losses)])
        t, tp = t_one_sample(diff, "the differences implied by the counts")
        out.update(n=int(n), delta=100.0 * (wins - losses) / n, t_items=t, t_items_p_value=tp)
    return out


def _draws(rng: np.random.Generator, n: int):
    """Endless batches of rng.integers(0, n)'s stream, bit for bit, twice as fast: numpy draws
    each bounded integer by Lemire's method from PCG64's 32-bit halves (low half first): x * n
    >> 32, unless the low 32 bits of x * n are below (2**32 - n) % n, when x is rejected and the
    next one tried. Yields (draws, positions of the rejected ones, which are to be skipped); the
    arrays are reused by the next batch. `rng` must be fresh (no half-used 64-bit word), as
    default_rng(seed) is."""
    threshold, n32, n64 = np.uint32((2**32 - n) % n), np.uint32(n), np.uint64(n)
    scaled, low = np.empty(_BATCH, np.uint64), np.empty(_BATCH, np.uint32)
    rejected = np.empty(_BATCH, bool)
    while True:
        x = rng.bit_generator.random_raw(_BATCH // 2).view(np.uint32)
        np.multiply(x, n64, out=scaled, dtype=np.uint64)
        scaled >>= np.uint64(32)
        np.multiply(x, n32, out=low)  # the low 32 bits of x * n (uint32 wraps)
        np.less(low, threshold, out=rejected)
        yield scaled.view(np.int64), np.flatnonzero(rejected)


def _resample_sums(signs: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """signs[rng.integers(0, n, (n_resamples, n))].sum(axis=1) in batches: the same numbers in
    O(n) memory (scipy.stats.bootstrap draws the whole index matrix at once)."""
    n = len(signs)
    sums = np.zeros(n_resamples, np.int64)
    done, total = 0, n_resamples * n
    v = np.empty(_BATCH, np.int8)
    for idx, rejected in _draws(rng, n):
        signs.take(idx, out=v, mode="wrap")  # in range anyway; "wrap" skips the bounds check
        row, at = divmod(done, n)
        if at + _BATCH - len(rejected) <= n:  # the batch is inside one resample
            v[rejected] = 0
            sums[row] += int(np.add.reduce(v, dtype=np.int32))  # |sum| <= _BATCH
            done += _BATCH - len(rejected)
        else:
            kept = (np.delete(v, rejected) if len(rejected) else v)[: total - done]
            cuts = np.arange(n - at, len(kept), n)
            sums[row : row + len(cuts) + 1] += np.add.reduceat(kept, np.r_[0, cuts], dtype=np.int64)
            done += len(kept)
        if done == total:
            return sums


def _multinomial_sums(signs: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The resamples' sums drawn from their exact distribution in O(n_resamples): n draws with
    replacement from -1/0/1 values are a multinomial over the three values' shares, and a sum
    depends only on those counts. Same law as the index stream, other random numbers."""
    values = np.array([-1, 0, 1], np.int8)
    shares = np.array([np.count_nonzero(signs == v) for v in values]) / len(signs)
    counts = rng.multinomial(len(signs), shares, size=n_resamples)
    return counts[:, 2].astype(np.int64) - counts[:, 0]


def _bca(sums: np.ndarray, signs: np.ndarray, level: float) -> np.ndarray:
    """scipy.stats.bootstrap's BCa interval of the mean of `signs` from the resamples' sums,
    operation for operation as scipy computes it (so the same bits), but with the jackknife of
    the mean in closed form: leaving item i out gives (sum - x_i) / (n - 1), exactly the float
    scipy's mean of the n - 1 kept values gives, since sums of small integers are exact."""
    n, total = len(signs), float(np.sum(signs, dtype=np.int64))
    theta_b = sums / n
    theta_hat = np.asarray([total / n])
    below = np.count_nonzero(theta_b < theta_hat) + np.count_nonzero(theta_b <= theta_hat)
    z0 = ndtri(np.asarray([below / (2 * len(theta_b))]))
    jack = (total - signs) / (n - 1)
    u = (float(n) - 1) * (np.mean(jack, keepdims=True) - jack)
    a = 1 / 6 * (np.sum(u**3) / float(n) ** 3) / (np.sum(u**2) / float(n) ** 2) ** (3 / 2)
    z = float(ndtri((1 - level) / 2))
    alphas = [ndtr(z0 + (z0 + zz) / (1 - a * (z0 + zz))) for zz in (z, -z)]
    return stats.quantile(theta_b, np.stack(alphas, axis=-1), axis=-1)[0]


def bootstrap_ci(
    diff, seed: int = 0, level: float = 0.95, name: str = "paired differences"
) -> tuple[float, float]:
    """BCa bootstrap CI of the mean paired difference (-1/0/1 per item), in points: the
    numbers of scipy.stats.bootstrap(..., n_resamples=2000, method="BCa",
    random_state=np.random.default_rng(seed)) up to EXACT_STREAM_MAX_N items, in O(n) memory
    and time; the same law, drawn from the resamples' multinomial counts, above it."""
    diff = finite(diff, name, "differences")
    if not np.isin(diff, (-1.0, 0.0, 1.0)).all():
        bad = int(np.flatnonzero(~np.isin(diff, (-1.0, 0.0, 1.0)))[0])
        raise ValueError(
            f"{name}: paired differences of 0/1 outcomes are -1, 0 or 1, got {float(diff[bad])!r} "
            f"at position {bad}"
        )
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if len(diff) < 2 or np.all(diff == diff[0]):
        return float(diff.mean() * 100), float(diff.mean() * 100)
    signs = diff.astype(np.int8)
    rng = np.random.default_rng(seed)
    if len(signs) <= EXACT_STREAM_MAX_N:
        sums = _resample_sums(signs, N_RESAMPLES, rng)
    else:
        sums = _multinomial_sums(signs, N_RESAMPLES, rng)
    lo, hi = _bca(sums, signs, level)
    if not (np.isfinite(lo) and np.isfinite(hi)):  # scipy would warn and return NaN
        raise ValueError(f"{name}: the BCa bootstrap interval is undefined (degenerate resamples)")
    return float(lo * 100), float(hi * 100)


def paired(
    cand: np.ndarray,
    ref: np.ndarray,
    seed: int = 0,
    names: tuple[str, str] = ("candidate", "reference"),
) -> dict:
    """Paired comparison of two 0/1 correctness vectors over the same items; `names` say in an
    error which readouts the vectors are."""
    cand = binary(_one_per_item(cand, names[0], "outcomes"), names[0])
    ref = binary(_one_per_item(ref, names[1], "outcomes"), names[1])
    if cand.shape != ref.shape:
        raise ValueError(
            f"{names[0]} vs {names[1]}: paired vectors differ in length: {len(cand)} vs {len(ref)}"
        )
    wins = int(np.sum(cand & ~ref))
    losses = int(np.sum(~cand & ref))
    diff = cand.astype(float) - ref.astype(float)
    both = f"{names[0]} vs {names[1]}"
    lo, hi = bootstrap_ci(diff, seed, name=both)
    # ttest_rel(cand, ref) is ttest_1samp(cand - ref): one helper, one definition of "undefined"
    t, tp = t_one_sample(diff, both)
    return {
        "n": int(len(cand)),
        "accuracy": float(cand.mean() * 100),
        "ref_accuracy": float(ref.mean() * 100),
        "delta": float(diff.mean() * 100),
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


def t_over_replicates(cand_acc, ref_acc, name: str = "replicates") -> dict:
    """Paired t over K replicates: ttest_rel of per-replicate accuracies (points), df = K - 1."""
    cand_acc = finite(cand_acc, f"{name}: candidate", "replicate accuracies")
    ref_acc = finite(ref_acc, f"{name}: reference", "replicate accuracies")
    if cand_acc.shape != ref_acc.shape:
        raise ValueError(
            f"{name}: replicate counts differ: {len(cand_acc)} candidate vs "
            f"{len(ref_acc)} reference"
        )
    deltas = cand_acc - ref_acc
    t, p = t_one_sample(deltas, f"{name}: replicate deltas")
    return {
        "t": t,
        "t_p_value": p,
        "t_df": int(len(deltas) - 1) if len(deltas) > 1 else None,
        "replicate_deltas": [float(d) for d in deltas],
    }


def noise_from_accuracies(accuracies, name: str = "noise floor") -> dict:
    """The part of a noise floor that replicate accuracies (points) alone determine.

    spread = max - min; mean_abs_delta / max_abs_delta over the K(K-1)/2 replicate pairs.
    max |t| is NOT determined by accuracies: it needs each pair's discordant counts (see
    `noise_floor`), so it is not returned here."""
    acc = [float(a) for a in finite(accuracies, name, "replicate accuracies")]
    if len(acc) < 2:
        raise ValueError(f"{name}: a noise floor needs >= 2 replicates, got {len(acc)}")
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
    if mat.ndim != 2 or mat.shape[0] < 2 or mat.shape[1] == 0:
        raise ValueError(
            f"{name}: a noise floor needs a K x N matrix with K >= 2 replicates of N >= 1 items, "
            f"got shape {mat.shape}"
        )
    out = noise_from_accuracies(mat.mean(axis=1) * 100, name)
    pairs = []
    for i, j in itertools.combinations(range(mat.shape[0]), 2):
        p = paired(mat[i], mat[j], names=(f"{name}: replicate {i}", f"{name}: replicate {j}"))
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
