"""Failure analysis by checker reason (docs/lineages.md#003-failure-analysis-by-checker-reason).

    python -m arenaflow.evals.failures --pool pools/if_eval.jsonl --cand
    readouts/if/A/greedy.r0.parquet
        [--ref readouts/if/P/greedy.r0.parquet] --out failures/if/greedy/A__P.json

For an instruction-following suite, one row per constraint family (word_eq, word_times, sent,
...): the prompts carrying it, the prompts failing it, the miss rate, and, against the parent
(`--ref`, paired by item and replicate), the prompts it fixed (parent failed that family, the arm
passes it) and lost (the reverse), with the exact sign test p on fixed vs lost
(arenaflow.evals.stats.mcnemar_exact). A prompt fails a family when any of its constraints of that
family fails. Per-check outcomes are re-derived with arenaflow.instruct.check from the pool's
constraints and each completion, and must reproduce the readout's `reasons` column: a readout made
by another checker is refused, naming the file and item, rather than tallied by a stale rule.
Count families (word_eq, sent, ...) also get the near-miss profile the card reports: failing
prompts off by at most 1, 2 and 3 of what was asked.

A prompt can fail several families, and an answer can be incorrect in the readout with every
check passed: the readout's `correct` (arenaflow.candidates.verdict) also asks that the answer
stopped (not truncated), is not empty, has no U+FFFD and does not loop. `incorrect` is the
partition of exactly the readout's incorrect rows: each under one reason, the first structural
flag it has (truncated, empty, fffd, loop: a cut-off or degenerate answer fails checks because
of it), else the family it failed, or its failed families joined by '+'. A row whose `correct`
disagrees with its flags and checks is refused, naming the file and item.

The JSON (sealed, with the sha256 of each readout) holds `table` (rows by family, in order of
failing prompts), `all` (prompts failing any check) and `incorrect` (rows, incorrect and
`by_reason`; with `--ref` also `ref_incorrect`); `python -m arenaflow.evals.failures ... --tsv` also
prints the table as tab-separated text.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd

from arenaflow import io, manifest
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout_file, stats
from arenaflow.instruct import check as ifcheck
from arenaflow.pools.validate import read_pool

# Families whose failure is a count off by some amount: (the reason's count pattern)
_HAVE = re.compile(r"^\w+: (?:.* appears )?(\d+) ")
_COUNT_FAMILIES = {"word_eq", "word_min", "word_max", "word_times", "sent", "para", "bullet"}
# The readout's structural flags that make an answer incorrect whatever its checks say
# (candidates.verdict), in the order a row is put down to them
STRUCTURAL = ("truncated", "empty", "fffd", "loop")


def per_check(pool: list[dict], df: pd.DataFrame, where: str) -> pd.DataFrame:
    """One row per (item, replicate, family): whether every constraint of that family passed,
    and for a failing count family |have - want| (else None)."""
    rows_by_id = {r["id"]: r for r in pool}
    out = []
    for rec in df.to_dict("records"):
        item = rows_by_id.get(rec["item_id"])
        if item is None or "constraints" not in item:
            raise ValueError(
                f"{where}: item {rec['item_id']!r} is not an instruction-following row of the pool"
            )
        res = ifcheck.check(rec["completion"] or "", item["constraints"])
        reasons = "; ".join(c["reason"] for c in res["checks"] if not c["passed"])
        if "reasons" in rec and reasons != rec["reasons"]:
            raise ValueError(
                f"{where}: item {rec['item_id']!r}: the checker now gives {reasons!r}, the "
                f"readout recorded {rec['reasons']!r} (made by another checker version?)"
            )
        fams: dict[str, dict] = {}
        for c, spec in zip(res["checks"], item["constraints"]):
            f = fams.setdefault(c["type"], {"passed": True, "off": None})
            if not c["passed"]:
                f["passed"] = False
                m = _HAVE.match(c["reason"])
                if c["type"] in _COUNT_FAMILIES and m and "n" in spec:
                    f["off"] = abs(int(m.group(1)) - spec["n"])
        for fam, f in fams.items():
            out.append(
                {
                    "item_id": rec["item_id"],
                    "replicate": rec.get("replicate", 0),
                    "family": fam,
                    **f,
                }
            )
    return pd.DataFrame(out, columns=["item_id", "replicate", "family", "passed", "off"])


def reason_of(rec: dict, failed: list[str]) -> str | None:
    """Why a readout row is incorrect (None: it is not): its first structural flag, else its
    failed families joined by '+'."""
    for flag in STRUCTURAL:
        if rec[flag]:
            return flag
    return "+".join(sorted(failed)) or None


def partition(c: pd.DataFrame, df: pd.DataFrame, where: str) -> dict:
    """{rows, incorrect, by_reason}: every incorrect row of the readout `df` under exactly one
    reason (reason_of), none of its correct rows; `c` is per_check(df). A row whose `correct`
    disagrees with its flags and checks raises ValueError naming it."""
    failed = c[~c["passed"]].groupby(["item_id", "replicate"])["family"].agg(list).to_dict()
    counts: dict[str, int] = {}
    for rec in df.to_dict("records"):
        rep_ = rec.get("replicate", 0)
        reason = reason_of(rec, failed.get((rec["item_id"], rep_), []))
        if bool(rec["correct"]) == (reason is not None):
            why = f"it is {reason}" if reason else "no check failed and it has no structural flag"
            raise ValueError(
                f"{where}: item {rec['item_id']!r}, replicate {rep_}: the readout has correct="
                f"{bool(rec['correct'])} but {why} (made by another definition of correct?)"
            )
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
    by_reason = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return {"rows": len(df), "incorrect": sum(counts.values()), "by_reason": by_reason}


def _row(fam: str, g: pd.DataFrame) -> dict:
    failing = int((~g["passed"]).sum())
    row = {
        "family": fam,
        "carrying": int(len(g)),
        "failing": failing,
        "miss_rate": failing / len(g) if len(g) else 0.0,
    }
    if fam in _COUNT_FAMILIES:
        off = g.loc[~g["passed"], "off"].dropna()
        row["near_miss"] = {f"off_le_{k}": int((off <= k).sum()) for k in (1, 2, 3)}
    return row


def _paired(row: dict, g: pd.DataFrame) -> dict:
    fixed = int((g["passed"] & ~g["passed_ref"]).sum())
    lost = int((~g["passed"] & g["passed_ref"]).sum())
    return {
        **row,
        "ref_failing": int((~g["passed_ref"]).sum()),
        "fixed": fixed,
        "lost": lost,
        "p_value": stats.mcnemar_exact(fixed, lost),
    }


def table(pool: list[dict], cand: pd.DataFrame, ref: pd.DataFrame | None, where: str) -> dict:
    """{"table": rows by family, most failing first, "all": prompts failing any check}; with
    `ref`, each row is also paired against it (fixed, lost, p)."""
    c = per_check(pool, cand, f"{where}: candidate")
    keys = ["item_id", "replicate", "family"]
    incorrect = {"incorrect": partition(c, cand, f"{where}: candidate")}
    if ref is not None:
        comparisons.paired_rows(cand, ref, where)  # same items, same prompts and targets
        r = per_check(pool, ref, f"{where}: reference")
        incorrect["ref_incorrect"] = partition(r, ref, f"{where}: reference")
        c = c.merge(r, on=keys, suffixes=("", "_ref"), how="inner", validate="one_to_one")
    rows = []
    for fam, g in c.groupby("family", sort=True):
        row = _row(fam, g)
        rows.append(_paired(row, g) if ref is not None else row)
    rows.sort(key=lambda x: (-x["failing"], x["family"]))
    anyfail = c.groupby(["item_id", "replicate"])["passed"].all()
    out = {"table": rows, "all": {"prompts": int(len(anyfail)), "failing": int((~anyfail).sum())}}
    if ref is not None:
        both = c.groupby(["item_id", "replicate"])[["passed", "passed_ref"]].all()
        out["all"] = _paired(out["all"], both)
    return {**out, **incorrect}


def tsv(record: dict) -> str:
    cols = ["family", "carrying", "failing", "miss_rate", "ref_failing", "fixed", "lost", "p_value"]
    cols = [k for k in cols if k in record["table"][0]] if record["table"] else cols[:4]
    lines = ["\t".join(cols)]
    for row in record["table"]:
        lines.append(
            "\t".join(f"{row[k]:.4g}" if isinstance(row[k], float) else str(row[k]) for k in cols)
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", required=True, help="the suite's pools/{pool}.jsonl")
    ap.add_argument("--cand", nargs="+", required=True, help="the arm's readouts (replicates)")
    ap.add_argument("--ref", nargs="*", default=None, help="the parent's readouts (same items)")
    ap.add_argument("--out", required=True, help="failures/{suite}/{regime}/{arm}__{ref}.json")
    ap.add_argument("--tsv", action="store_true", help="also print the table as TSV")
    args = ap.parse_args(argv)
    pool = read_pool(args.pool)
    cand = readout_file.load(args.cand)
    ref = readout_file.load(args.ref) if args.ref else None
    record = table(pool, cand, ref, args.out)
    record.update(
        pool=args.pool,
        cand=str(cand["arm"].iloc[0]) if "arm" in cand else None,
        ref=str(ref["arm"].iloc[0]) if ref is not None and "arm" in ref else None,
        readouts={
            "cand": comparisons._sources(args.cand),
            "ref": comparisons._sources(args.ref or []),
        },
    )
    io.write_json(Path(args.out), manifest.seal(record))
    a = record["all"]
    print(f"{record['cand']}: {a['failing']}/{a['prompts']} prompts fail a check -> {args.out}")
    i = record["incorrect"]
    reasons = ", ".join(f"{k} {n}" for k, n in i["by_reason"].items())
    print(f"{i['incorrect']}/{i['rows']} incorrect in the readout: {reasons or 'none'}")
    if args.tsv:
        print(tsv(record), end="")


if __name__ == "__main__":
    main()
