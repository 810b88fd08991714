"""Per-constraint-family deltas of an instruction-following comparison, with W/L.

Lineage 002 reported its headline IF delta per constraint family ("paragraphs +24, repeat +14,
... lowercase -2, uppercase -2: no family collapsed", docs/lineages.md#002-headline-reads) and
pre-registered "no collapsed family" as a promotion clause. arenaflow.evals.readout readouts of
items
with constraints carry `checks`: arenaflow.instruct.check.check's verdict per constraint, as JSON
[{"type": family, "passed": bool}, ...] in the prompt's order. For each family f, over the
(item, replicate) pairs whose prompt carries f (paired as evals.compare pairs them):

- prompts: how many pairs carry f; cand_pass, ref_pass: the share (points) whose f check(s)
  passed; delta = cand_pass - ref_pass (points);
- wins ("fixed"): f passes for the candidate and fails for the reference; losses the reverse;
- p_value: the exact two-sided sign test over those discordant prompts (stats.mcnemar_exact).

Check level on purpose: a prompt failed on its word count still says whether its no-comma
constraint held. evals.compare adds `by_family` and `family_delta_min` (the smallest delta,
what a bar's per-family floor clause reads, arenaflow.rounds.bar) to the compare JSON.

    python -m arenaflow.instruct.families compare/ifeval/greedy/B__A.json   # the table, as markdown
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from arenaflow import io, manifest
from arenaflow.evals import stats
from arenaflow.instruct import check as ifcheck


def checks_of(text: str, constraints: list[dict]) -> str:
    """The readout's `checks` cell: each constraint's family and whether `text` satisfies it."""
    verdict = ifcheck.check(text, constraints)["checks"]
    return json.dumps([{"type": c["type"], "passed": bool(c["passed"])} for c in verdict])


def outcomes(cell, where: str) -> dict[str, bool]:
    """{family: every check of that family passed} of one `checks` cell (None or NaN: no
    constraints); a cell that is not such a list raises ValueError naming `where`."""
    if cell is None or (isinstance(cell, float) and pd.isna(cell)):
        return {}
    try:
        checks = json.loads(cell)
        out: dict[str, bool] = {}
        for c in checks:
            out[c["type"]] = out.get(c["type"], True) and bool(c["passed"])
        return out
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"{where}: unreadable checks cell {cell!r}: {e}") from None


def table(m: pd.DataFrame, where: str) -> dict[str, dict]:
    """{family: row} over paired rows `m` with `checks` and `checks_ref` (evals.paired_rows);
    both sides must carry the same families per item (same prompts, same constraints)."""
    rows: dict[str, list[tuple[bool, bool]]] = {}
    for item, rep, c, r in zip(m["item_id"], m["replicate"], m["checks"], m["checks_ref"]):
        at = f"{where}: item {item!r}, replicate {rep}"
        cand, ref = outcomes(c, at + " (candidate)"), outcomes(r, at + " (reference)")
        if set(cand) != set(ref):
            raise ValueError(f"{at}: families {sorted(cand)} vs {sorted(ref)} on the two sides")
        for family in cand:
            rows.setdefault(family, []).append((cand[family], ref[family]))
    out = {}
    for family in sorted(rows):
        pairs = rows[family]
        wins = sum(c and not r for c, r in pairs)
        losses = sum(r and not c for c, r in pairs)
        n = len(pairs)
        cand_pass = 100.0 * sum(c for c, _ in pairs) / n
        ref_pass = 100.0 * sum(r for _, r in pairs) / n
        out[family] = {
            "prompts": n,
            "cand_pass": cand_pass,
            "ref_pass": ref_pass,
            "delta": cand_pass - ref_pass,
            "wins": wins,
            "losses": losses,
            "wins_minus_losses": wins - losses,
            "p_value": stats.mcnemar_exact(wins, losses),
        }
    return out


def summary(by_family: dict[str, dict]) -> dict:
    """What compare records beside the table: the smallest family delta and its family (None
    where no item carries a constraint)."""
    if not by_family:
        return {"family_delta_min": None, "family_min": None}
    worst = min(by_family, key=lambda f: (by_family[f]["delta"], f))
    return {"family_delta_min": by_family[worst]["delta"], "family_min": worst}


def markdown(by_family: dict[str, dict]) -> str:
    head = "| family | prompts | cand | ref | delta | W/L | p |\n" + "| --- " * 7 + "|"
    lines = [
        f"| {f} | {r['prompts']} | {r['cand_pass']:.1f} | {r['ref_pass']:.1f} | "
        f"{r['delta']:+.1f} | {r['wins']}/{r['losses']} | {r['p_value']:.3g} |"
        for f, r in by_family.items()
    ]
    return "\n".join([head, *lines])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "compare", help="a compare JSON of an ifeval suite (python -m arenaflow.evals.compare)"
    )
    args = ap.parse_args(argv)
    record = manifest.check_seal(io.read_json(args.compare), args.compare)
    if "by_family" not in record:
        raise SystemExit(
            f"{args.compare}: no by_family table: its readouts carry no `checks` "
            "(not an ifeval suite, or read out before checks were recorded)"
        )
    print(markdown(record["by_family"]))


if __name__ == "__main__":
    main()
