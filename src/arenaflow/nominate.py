"""Apply a round's bar to its candidates and name the arm it promotes.

    python -m arenaflow.nominate --round r3 --round-json '{...}' --compare compare/.../B1__R2d.json ... \
        --out nominations/r3.json

Every clause of the bar is checked against each candidate's paired comparison with the
incumbent. Among the candidates that clear every clause the largest delta is promoted (ties:
the first listed); when none clears, the incumbent stays. The output records every number and
verdict, and the sha256 of the bar it applied.
"""

from __future__ import annotations

import argparse
import json
import operator

from arenaflow import io, manifest

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def bar_sha256(bar: list[dict]) -> str:
    return manifest.sha256_text(json.dumps(bar, sort_keys=True, separators=(",", ":")))


def judge(candidate: str, comparison: dict, bar: list[dict]) -> dict:
    clauses = []
    for c in bar:
        value = comparison[c["metric"]]
        clauses.append({**c, "observed": value, "holds": bool(OPS[c["op"]](value, c["value"]))})
    return {"arm": candidate, "clears": all(c["holds"] for c in clauses), "clauses": clauses,
            "delta": comparison["delta"], "wins": comparison["wins"], "losses": comparison["losses"],
            "p_value": comparison["p_value"], "ci95": comparison["ci95"]}


def nominate(round_id: str, rnd: dict, comparisons: dict[str, dict]) -> dict:
    missing = [c for c in rnd["candidates"] if c not in comparisons]
    if missing:
        raise ValueError(f"round {round_id}: no comparison for candidates {missing}")
    verdicts = [judge(c, comparisons[c], rnd["bar"]) for c in rnd["candidates"]]
    cleared = [v for v in verdicts if v["clears"]]
    if cleared:
        best = max(cleared, key=lambda v: v["delta"])  # max keeps the first of equal deltas
        promoted = best["arm"]
        reason = (f"{promoted} clears every clause with the largest delta among "
                  f"{len(cleared)} that clear ({best['delta']:+.2f} pt vs {rnd['incumbent']})")
    else:
        promoted = rnd["incumbent"]
        reason = f"no candidate clears the bar; the incumbent {promoted} stays"
    return {"round": round_id, "suite": rnd["suite"], "regime": rnd["regime"],
            "incumbent": rnd["incumbent"], "bar": rnd["bar"], "bar_sha256": bar_sha256(rnd["bar"]),
            "candidates": verdicts, "promoted": promoted, "reason": reason}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round", required=True, help="round id")
    ap.add_argument("--round-json", required=True, help="the round's config section as JSON")
    ap.add_argument("--compare", nargs="+", required=True, help="compare JSONs, candidate vs incumbent")
    ap.add_argument("--out", required=True, help="nominations/{round}.json")
    args = ap.parse_args(argv)
    rnd = json.loads(args.round_json)
    comparisons = {}
    for path in args.compare:
        c = io.read_json(path)
        if c["ref"] != rnd["incumbent"]:
            raise ValueError(f"{path}: compares against {c['ref']!r}, not the incumbent {rnd['incumbent']!r}")
        comparisons[c["cand"]] = c
    result = nominate(args.round, rnd, comparisons)
    io.write_json(args.out, result)
    for v in result["candidates"]:
        print(f"  {v['arm']}: delta {v['delta']:+.2f} W/L {v['wins']}/{v['losses']} -> "
              f"{'clears' if v['clears'] else 'fails'}")
    print(f"round {args.round}: promoted {result['promoted']} ({result['reason']})")


if __name__ == "__main__":
    main()
