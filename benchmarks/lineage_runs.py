"""Several lineage_gpu.py reports side by side: did a setting change the lineage's speed?

    python benchmarks/lineage_runs.py benchmarks/results/lineage_gpu-2026-12-05-run6[3-7].json
    ... --arm arm=R220      # the arm to follow (default: the slowest in steady tokens/s, per run)

One run is not an answer on a shared GPU host: the same code's R220 step took 0.134 s in one run
and 0.196 s in the next (BENCHMARKS.md, runs 63-67). This prints, as markdown, one row a run
(its variant: the `--set` overrides it ran with; the DAG's wall time; which of the three speed
targets it met; the followed arm's median step, own GPU-busy fraction and steady tokens/s), then
one row a variant with the medians, and, where there are two variants, a two-sided Mann-Whitney
U test of the arm's step time between them (exact for small samples; runs of one lease are not
independent of each other, so alternate the variants within a lease).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from scipy.stats import mannwhitneyu

TARGETS = ("dag_wall", "gpu_busy_after_load", "train_tokens_per_s")
DEFAULT_VARIANT = "as configured"


def flat(tree: dict, prefix: str = "") -> dict:
    """{'a': {'b': 1}} -> {'a.b': 1}: the overrides as `--set` spells them."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def variant(report: dict) -> str:
    sets = flat(report.get("overrides") or {})
    return ", ".join(f"{k}={v}" for k, v in sorted(sets.items())) or DEFAULT_VARIANT


def run_row(path: Path, report: dict, arm: str | None) -> dict:
    """One report's numbers; `arm` None follows the run's slowest arm."""
    steady = report["targets"]["train_tokens_per_s"]["per_arm_steady"]
    arm = arm or min(steady, key=steady.get)
    jobs = [j for j in report["jobs"] if j["rule"] == "train_arm" and j["wildcards"] == arm]
    if len(jobs) != 1:
        raise SystemExit(f"{path}: {len(jobs)} train_arm jobs with wildcards {arm!r}, expected 1")
    job = jobs[0]
    return {
        "run": path.stem,
        "variant": variant(report),
        "commit": report.get("commit"),
        "dag_wall_s": report["summary"]["dag_wall_s"],
        "met": {t: report["targets"][t]["met"] for t in TARGETS},
        "arm": arm,
        "step_s": job["step_s_median"],
        "busy_own": job.get("gpu_busy_own"),
        "steady_tokens_per_s": job["steady_tokens_per_s"],
    }


def compare(rows: list[dict]) -> dict:
    """Medians a variant; with two variants, the U test of the followed arm's step time."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["variant"], []).append(r)
    med = {
        v: {
            "runs": len(rs),
            "all_met": sum(all(r["met"].values()) for r in rs),
            **{
                k: statistics.median(r[k] for r in rs)
                for k in ("dag_wall_s", "step_s", "steady_tokens_per_s")
            },
        }
        for v, rs in by.items()
    }
    out = {"variants": med}
    if len(by) == 2:
        (va, a), (vb, b) = by.items()
        test = mannwhitneyu([r["step_s"] for r in a], [r["step_s"] for r in b])
        out["step_s_test"] = {"a": va, "b": vb, "U": float(test.statistic), "p": float(test.pvalue)}
    return out


def markdown(rows: list[dict], summary: dict) -> str:
    yes = {True: "yes", False: "**no**"}
    lines = [
        "| run | commit | variant | DAG wall | targets met (wall, busy, tokens/s) | arm "
        "| step (median) | own busy | steady tokens/s |",
        "| --- | --- | --- | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        met = ", ".join(yes[m] for m in r["met"].values())
        busy = "-" if r["busy_own"] is None else f"{r['busy_own']:.0%}"
        lines.append(
            f"| {r['run']} | {r['commit']} | {r['variant']} | {r['dag_wall_s']:.1f} s | {met} "
            f"| {r['arm']} | {r['step_s']:.3f} s | {busy} | {r['steady_tokens_per_s'] / 1e3:.1f}k |"
        )
    lines += ["", "| variant | runs | all three met | DAG wall | step | steady tokens/s |"]
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for v, m in summary["variants"].items():
        lines.append(
            f"| {v} | {m['runs']} | {m['all_met']} | {m['dag_wall_s']:.1f} s "
            f"| {m['step_s']:.3f} s | {m['steady_tokens_per_s'] / 1e3:.1f}k |"
        )
    if "step_s_test" in summary:
        t = summary["step_s_test"]
        lines += [
            "",
            f"Step time, {t['a']} against {t['b']}: Mann-Whitney U = {t['U']:.1f}, "
            f"two-sided p = {t['p']:.3f}",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="lineage_gpu.py --out JSON files")
    ap.add_argument("--arm", help="the train_arm wildcards to follow, e.g. arm=R220")
    ap.add_argument("--json", type=Path, help="also write the rows and the comparison here")
    args = ap.parse_args(argv)
    rows = [run_row(p, json.loads(p.read_text()), args.arm) for p in args.reports]
    summary = compare(rows)
    print(markdown(rows, summary))
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, **summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
