"""Time and peak memory of arenaflow.evals.stats.paired (exact McNemar, sign test, paired t and
the 2000-resample BCa bootstrap) on n paired 0/1 items, against scipy.stats.bootstrap's own
interval where that can still run (its jackknife holds an n x n-1 matrix: ~1.7 GB at 10^4,
6.7 GiB at 3 x 10^4). Checks that both give the same numbers, bit for bit.

    python benchmarks/stats_scale.py [--sizes 10000,100000,1000000] [--scipy-up-to 10000] \
        [--out benchmarks/results/stats_scale-<date>.txt]

One core: numpy's and scipy's statistics here are single-threaded. Prints, per n: wall and CPU
seconds, the tracemalloc peak (numpy reports its buffers to tracemalloc) and the growth of the
process's max RSS; the load average, since the CPU is shared.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time
import tracemalloc
from unittest import mock

import numpy as np
import scipy
from scipy import stats as scipy_stats

from arenaflow.evals import stats


def scipy_bootstrap_ci(diff, seed: int = 0, level: float = 0.95, name: str = "") -> tuple:
    """The interval as evals.stats computed it before: scipy.stats.bootstrap itself."""
    diff = np.asarray(diff, dtype=float)
    if np.all(diff == diff[0]):
        return float(diff[0] * 100), float(diff[0] * 100)
    res = scipy_stats.bootstrap(
        (diff,),
        np.mean,
        confidence_level=level,
        n_resamples=stats.N_RESAMPLES,
        random_state=np.random.default_rng(seed),
        method="BCa",
    )
    return float(res.confidence_interval.low * 100), float(res.confidence_interval.high * 100)


def scipy_paired(cand: np.ndarray, ref: np.ndarray) -> dict:
    """stats.paired as it was: its interval from scipy.stats.bootstrap."""
    with mock.patch.object(stats, "bootstrap_ci", scipy_bootstrap_ci):
        return stats.paired(cand, ref)


def measure(fn) -> tuple[dict, dict]:
    """fn()'s result and its wall/CPU seconds, tracemalloc peak and max-RSS growth (MiB)."""
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0  # KiB on Linux
    return out, {"wall_s": wall, "cpu_s": cpu, "peak_mib": peak / 2**20, "rss_mib": rss / 1024}


def items(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A candidate at ~62 % against a reference at ~60 %, correlated as two checkpoints are."""
    rng = np.random.default_rng(seed)
    ref = rng.random(n) < 0.60
    flip = rng.random(n) < 0.15
    return np.where(flip, rng.random(n) < 0.62, ref), ref


def draws(n: int, impl: str) -> str:
    """How the bootstrap's resamples were drawn at n."""
    if impl != "evals.stats" or n <= stats.EXACT_STREAM_MAX_N:
        return "index stream"
    return "multinomial counts"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="n items, comma-separated")
    ap.add_argument(
        "--scipy-up-to", type=int, default=10_000, help="run scipy's interval too up to this n"
    )
    ap.add_argument("--out", default=None, help="also write the printed lines here")
    args = ap.parse_args(argv)
    lines = [
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"numpy {np.__version__}, scipy {scipy.__version__}",
        "n\timpl\tbootstrap\twall_s\tcpu_s\ttracemalloc_peak_mib\tmaxrss_growth_mib\tload_1min\tci95",
    ]
    print("\n".join(lines), flush=True)
    sizes = [int(n) for n in args.sizes.split(",")]
    results = {}

    def run(n: int, impl: str, fn) -> None:
        cand, ref = items(n)
        results[n, impl] = measure(lambda: fn(cand, ref))
        out, m = results[n, impl]
        line = (
            f"{n}\t{impl}\t{draws(n, impl)}\t{m['wall_s']:.2f}\t{m['cpu_s']:.2f}\t"
            f"{m['peak_mib']:.1f}\t"
            f"{m['rss_mib']:.1f}\t{os.getloadavg()[0]:.1f}\t{out['ci95']}"
        )
        lines.append(line)
        print(line, flush=True)

    # evals.stats first, smallest n first: the max RSS only grows, so scipy's (~1.7 GB at 10^4)
    # would hide the others' growth
    for n in sizes:
        run(n, "evals.stats", stats.paired)
    for n in (n for n in sizes if n <= args.scipy_up_to):
        run(n, "scipy.bootstrap", scipy_paired)
        (new, mn), (old, mo) = results[n, "evals.stats"], results[n, "scipy.bootstrap"]
        line = (
            f"# n={n}: same numbers as scipy's: {new == old}; scipy / evals.stats: "
            f"wall {mo['wall_s'] / mn['wall_s']:.0f}x, cpu {mo['cpu_s'] / mn['cpu_s']:.0f}x, "
            f"tracemalloc peak {mo['peak_mib'] / mn['peak_mib']:.0f}x"
        )
        lines.append(line)
        print(line, flush=True)
        if new != old:
            raise SystemExit(f"n={n}: evals.stats and scipy.stats.bootstrap disagree")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
