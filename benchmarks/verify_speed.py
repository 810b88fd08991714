"""What the math verdict costs per sample: arenaflow.verify.check over the labelled set
(tests/data/math_verdicts.jsonl), for the working tree and earlier revisions of verify.py (and,
from the revision that split it out, answers.py, the answer extraction it calls).

    python benchmarks/verify_speed.py [--revs HEAD~1 ...] [--repeats 3] [--out speed.json]

Each revision's verify.py runs in a fresh process (sympy's caches start empty), revisions taking
turns; a run times one pass of check() over every labelled row after the imports, with
math-verify's parse cache cold, and a second pass with it warm. Reported: ms a row, the best of
--repeats runs for each revision.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABELLED = ROOT / "tests" / "data" / "math_verdicts.jsonl"
# the verdict's modules: answers.py from the revision that split it out of verify.py
MODULES = ("verify.py", "answers.py")

# One run, in its own process: argv[1] is the directory holding the revision's arenaflow package
# (its verify.py and answers.py only), argv[2] the labelled set.
RUN = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import arenaflow.verify as v
rows = [json.loads(line) for line in open(sys.argv[2])]
v.check("The answer is 1.", "1")
v.check("\\\\boxed{\\\\frac{1}{2}}", "0.5")  # math-verify and sympy imported
times = []
for _ in range(2):
    start = time.perf_counter()
    for r in rows:
        v.check(r["completion"], r["gold"])
    times.append((time.perf_counter() - start) * 1000 / len(rows))
print(json.dumps({"rows": len(rows), "cold_ms": times[0], "warm_ms": times[1]}))
"""


def source(rev: str, tmp: Path) -> Path:
    """A directory whose arenaflow package holds verify.py of `rev` ("WORKTREE" for the files on
    disk) and the answers.py it imports, where the revision has one."""
    if rev == "WORKTREE":
        return ROOT / "src"
    root = tmp / f"rev_{len(list(tmp.iterdir()))}"
    (root / "arenaflow").mkdir(parents=True)
    (root / "arenaflow" / "__init__.py").write_text("")
    for name in MODULES:
        shown = subprocess.run(
            ["git", "show", f"{rev}:src/arenaflow/{name}"], cwd=ROOT, capture_output=True, text=True
        )
        if shown.returncode == 0:
            (root / "arenaflow" / name).write_text(shown.stdout)
    if not (root / "arenaflow" / "verify.py").exists():
        raise SystemExit(f"{rev}: no src/arenaflow/verify.py")
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--revs", nargs="+", default=["HEAD", "WORKTREE"], help="git revisions")
    parser.add_argument("--repeats", type=int, default=3, help="runs per revision (best kept)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = {rev: source(rev, Path(tmp)) for rev in args.revs}
        runs = {rev: [] for rev in args.revs}
        for _ in range(args.repeats):
            for rev, path in files.items():
                out = subprocess.run(
                    [sys.executable, "-c", RUN, str(path), str(LABELLED)],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[rev].append(json.loads(out.stdout))
    result = {
        rev: {
            "rows": r[0]["rows"],
            "cold_ms_per_row": min(x["cold_ms"] for x in r),
            "warm_ms_per_row": min(x["warm_ms"] for x in r),
            "runs": r,
        }
        for rev, r in runs.items()
    }
    for rev, r in result.items():
        print(f"{rev:>12}: {r['cold_ms_per_row']:.2f} ms/row cold, {r['warm_ms_per_row']:.2f} warm")
    if args.out:
        tmp_out = args.out.with_suffix(".tmp")
        tmp_out.write_text(json.dumps(result, indent=1) + "\n")
        tmp_out.rename(args.out)


if __name__ == "__main__":
    main()
