"""Judged paired reads, as lineage 002 ran them: a blinded read of two arms' answers to the same
prompts, scored by a judge arenaflow does not run (a person, usually). Lineage 002's reads:
docs/lineages.md#002-the-blinded-judged-read and docs/lineages.md#002-the-safety-probe.

`pack` builds the packet from two readouts of the same suite: every item where the two arms
disagree structurally, then a sample of the concordant items stratified by category, up to n
pairs, in shuffled order, each pair's sides swapped at random (seeded). Structurally is the
card's answer-usable check (stopped, non-empty, ends on a terminator, no degenerate repetition):
its blinded read took "all 11 prompts where the two checkpoints had already disagreed" on it. An
item is discordant when the readouts' `answer_usable` differ, the column the readout reports
(arenaflow.evals.readout_rows.structure, degeneracy.answer_usable: one definition). The judge gets
`pairs.jsonl` (pair, prompt, A, B: no arm names); the key (which arm is A, which item, which
stratum, the packet's sha256) is written to a separate file, to be opened only after scoring.

`score` reads the judge's CSV, in one of two forms:
  - a preference read: columns `pair,verdict`, verdict A, B or tie. A and B are mapped through
    the key; a verdict already written in arm terms (an arm's name) passes through unchanged and
    is never mapped again (lineage 002's first scorer applied the key twice to such rows);
  - an adjudication, e.g. a safety probe: columns `pair,A,B`, each side 1 or 0 for the property
    judged (refuses, correct, ...), mapped to the arms.
Either way the two arms are compared paired by item: wins/losses (or one-sided outcomes) and the
exact two-sided sign test (= exact McNemar) over the discordant pairs.

    python -m arenaflow.evals.judged pack --pool pools/P.jsonl --a READOUT_X --b READOUT_Y --n 40 \\
        --seed 20261005 --out judged/X_vs_Y --key judged/X_vs_Y.key.json
    python -m arenaflow.evals.judged score --pairs judged/X_vs_Y/pairs.jsonl \\
        --key judged/X_vs_Y.key.json --scores scores.csv --out judged/X_vs_Y.result.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from arenaflow import io, manifest
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout_file, stats
from arenaflow.pools.validate import read_pool

USABLE = "answer_usable"  # the readout's column a read is stratified on (readout_rows.structure)
TRUE, FALSE = {"1", "true", "yes", "y"}, {"0", "false", "no", "n"}


def allocate(sizes: dict[str, int], n: int) -> dict[str, int]:
    """n draws spread over groups in proportion to their sizes (largest remainder, ties by name)."""
    total = sum(sizes.values())
    quota = {g: n * s / total for g, s in sizes.items()}
    take = {g: int(q) for g, q in quota.items()}
    for g in sorted(quota, key=lambda g: (-(quota[g] - take[g]), g))[: n - sum(take.values())]:
        take[g] += 1
    return take


def select(pairs: pd.DataFrame, n: int, rng: np.random.Generator) -> pd.DataFrame:
    """The items to read, with their stratum: every structurally discordant item (answer_usable
    differs; a random n of them if there are more), then concordant ones stratified by
    category."""
    discordant = pairs[USABLE].to_numpy(bool) != pairs[f"{USABLE}_ref"].to_numpy(bool)
    disc, conc = pairs[discordant], pairs[~discordant]
    if len(disc) > n:
        disc = disc.iloc[np.sort(rng.choice(len(disc), n, replace=False))]
    take = allocate(conc.groupby("category").size().to_dict(), n - len(disc)) if len(conc) else {}
    parts = [disc.assign(stratum="structurally discordant")]
    for cat, k in sorted(take.items()):
        group = conc[conc["category"] == cat]
        parts.append(
            group.iloc[np.sort(rng.choice(len(group), k, replace=False))].assign(
                stratum="concordant"
            )
        )
    return pd.concat(parts, ignore_index=True)


def pack(
    pool: list[dict], a: pd.DataFrame, b: pd.DataFrame, n: int, seed: int, where: str
) -> tuple[list, dict]:
    """(pairs for the judge, the key) for n items of readouts a and b (one replicate each)."""
    labels = [str(a["arm"].iloc[0]), str(b["arm"].iloc[0])]
    if labels[0] == labels[1]:
        raise ValueError(
            f"{where}: both readouts are of arm {labels[0]!r}; a judged read compares two arms"
        )
    pairs = comparisons.paired_rows(readout_file.structured(a), readout_file.structured(b), where)
    if not 0 < n <= len(pairs):
        raise ValueError(f"{where}: n must be between 1 and the {len(pairs)} paired items, got {n}")
    prompts = {r["id"]: r["prompt"] for r in pool}
    missing = sorted(set(pairs["item_id"]) - prompts.keys())
    if missing:
        raise ValueError(
            f"{where}: item {missing[0]!r} (and {len(missing) - 1} more) is not in the pool"
        )
    rng = np.random.default_rng(seed)
    chosen = select(pairs, n, rng)
    order, swap = rng.permutation(len(chosen)), rng.random(len(chosen)) < 0.5
    out, key = [], {}
    for i, (j, s) in enumerate(zip(order, swap), 1):
        row = chosen.iloc[j]
        sides = [(labels[0], row["completion"]), (labels[1], row["completion_ref"])]
        (a_arm, a_text), (b_arm, b_text) = sides[::-1] if s else sides
        pid = f"p{i:0{len(str(n))}d}"
        out.append({"pair": pid, "prompt": prompts[row["item_id"]], "A": a_text, "B": b_text})
        key[pid] = {
            "A": a_arm,
            "B": b_arm,
            "item_id": row["item_id"],
            "category": row["category"],
            "stratum": row["stratum"],
        }
    strata = chosen.groupby("stratum").size().to_dict()
    return out, {
        "arms": labels,
        "n": n,
        "seed": seed,
        "pairs": key,
        "strata": strata,
        "concordant_by_category": chosen[chosen["stratum"] == "concordant"]
        .groupby("category")
        .size()
        .to_dict(),
    }


def _verdict(raw: str, arms: list[str], row: dict, where: str) -> str:
    """The arm a verdict prefers, or 'tie'."""
    v = raw.strip()
    if v in arms:  # already in arm terms: never mapped through the key again
        return v
    if v.upper() in ("A", "B"):
        return row[v.upper()]
    if v.lower() == "tie":
        return "tie"
    raise ValueError(
        f"{where}: verdict {raw!r}; expected A, B, tie or an arm name ({', '.join(arms)})"
    )


def _label(raw: str, where: str) -> bool:
    v = raw.strip().lower()
    if v in TRUE | FALSE:
        return v in TRUE
    raise ValueError(f"{where}: {raw!r}; expected 1 or 0 (yes/no, true/false)")


def score(key: dict, scores: pd.DataFrame, shown: str) -> dict:
    """Unblinds the judge's scores through the key and compares the arms paired by item."""
    cols = set(scores.columns)
    if cols not in ({"pair", "verdict"}, {"pair", "A", "B"}):
        raise ValueError(
            f"{shown}: columns {sorted(cols)}; expected pair,verdict (a preference read) "
            "or pair,A,B (an adjudication of each side, 1/0)"
        )
    x, y = key["arms"]
    df = _unblind(key, scores, shown)
    return {
        "kind": "preference" if "verdict" in cols else "adjudication",
        "arms": [x, y],
        "n": len(df),
        **_tally(df, x, y),
        "by_stratum": {s: _tally(d, x, y) for s, d in df.groupby("stratum")},
        "by_category": {c: _tally(d, x, y) for c, d in df.groupby("category")},
        "rows": df.to_dict("records"),
    }


def _unblind(key: dict, scores: pd.DataFrame, shown: str) -> pd.DataFrame:
    """The scores in arm terms, one row per pair with its key entry: `preferred` (an arm or
    'tie') for a preference read, each arm's True/False for an adjudication. A pair not in the
    key, scored twice or left unscored raises ValueError naming the CSV line."""
    x, y = key["arms"]
    seen: dict[str, int] = {}
    rows = []
    for i, rec in enumerate(scores.to_dict("records")):
        where = f"{shown}:{i + 2}"  # line 1 is the header
        pid = str(rec["pair"]).strip()
        if pid not in key["pairs"]:
            raise ValueError(f"{where}: pair {pid!r} is not in the key")
        if pid in seen:
            raise ValueError(f"{where}: pair {pid!r} is scored twice (first on line {seen[pid]})")
        seen[pid] = i + 2
        k = key["pairs"][pid]
        if "verdict" in rec:
            rows.append(
                {
                    "pair": pid,
                    **k,
                    "written": rec["verdict"],
                    "preferred": _verdict(rec["verdict"], key["arms"], k, where),
                }
            )
        else:
            side = {
                k["A"]: _label(rec["A"], f"{where} (column A)"),
                k["B"]: _label(rec["B"], f"{where} (column B)"),
            }
            rows.append({"pair": pid, **k, x: side[x], y: side[y]})
    unscored = sorted(set(key["pairs"]) - seen.keys())
    if unscored:
        raise ValueError(
            f"{shown}: {len(unscored)} pairs are not scored: {', '.join(unscored[:10])}"
        )
    return pd.DataFrame(rows)


def _tally(d: pd.DataFrame, x: str, y: str) -> dict:
    """Arm x against arm y over the unblinded rows d: the counts, and the sign test over the
    pairs where they differ."""
    if "preferred" in d:
        w, l_ = int((d["preferred"] == x).sum()), int((d["preferred"] == y).sum())
        counts = {"preferred": {x: w, y: l_}, "ties": int((d["preferred"] == "tie").sum())}
    else:
        w, l_ = int((d[x] & ~d[y]).sum()), int((d[y] & ~d[x]).sum())
        counts = {"positive": {x: int(d[x].sum()), y: int(d[y].sum())}, "only": {x: w, y: l_}}
    paired = stats.from_counts(w, l_)  # the same sign test the readout comparisons use
    return {**counts, "discordant": paired["discordant"], "p_value": paired["p_value"]}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="Blinded judged reads of two arms (see the module docstring)."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="the judge's packet and its key, kept apart")
    p.add_argument("--pool", required=True, help="the suite's pools/{pool}.jsonl (the prompts)")
    p.add_argument("--a", required=True, help="one readout parquet of the first arm")
    p.add_argument("--b", required=True, help="the same suite's readout of the second arm")
    p.add_argument("--n", type=int, required=True, help="pairs to read")
    p.add_argument(
        "--seed", type=int, required=True, help="seeds the sample, the order and the swaps"
    )
    p.add_argument("--out", required=True, help="directory for pairs.jsonl (what the judge reads)")
    p.add_argument("--key", required=True, help="the key's path, outside --out")
    s = sub.add_parser("score", help="unblind the judge's scores and compare the arms")
    s.add_argument("--pairs", required=True, help="the packet's pairs.jsonl")
    s.add_argument("--key", required=True)
    s.add_argument("--scores", required=True, help="CSV: pair,verdict or pair,A,B")
    s.add_argument("--out", required=True, help="result JSON")
    return ap


def _pack_cmd(args) -> None:
    out, key_path = Path(args.out), Path(args.key)
    if key_path.resolve().is_relative_to(out.resolve()):
        raise SystemExit(
            f"--key {key_path} is inside --out {out}: the judge would get the key with the packet"
        )
    try:
        pairs, key = pack(
            read_pool(args.pool),
            # checksums verified; an older readout's battery recomputed
            readout_file.load([args.a]),
            readout_file.load([args.b]),
            args.n,
            args.seed,
            f"{args.a} vs {args.b}",
        )
    except ValueError as e:
        raise SystemExit(str(e)) from None
    with io.atomic_dir(out) as tmp:
        io.write_jsonl(tmp / "pairs.jsonl", pairs)
    key.update(
        pairs_sha256=manifest.sha256_file(out / "pairs.jsonl"),
        pool=args.pool,
        readouts=[{"path": p, "sha256": manifest.sha256_file(p)} for p in (args.a, args.b)],
    )
    io.write_json(key_path, key)
    print(f"{len(pairs)} pairs ({key['strata']}) -> {out / 'pairs.jsonl'}; key -> {key_path}")


def _score_cmd(args) -> None:
    key = io.read_json(args.key)
    if manifest.sha256_file(args.pairs) != key["pairs_sha256"]:
        raise SystemExit(
            f"{args.pairs} is not the packet {args.key} was written for (sha256 differs)"
        )
    try:
        res = score(key, pd.read_csv(args.scores, dtype=str, keep_default_na=False), args.scores)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    res.update(
        key=args.key, scores={"path": args.scores, "sha256": manifest.sha256_file(args.scores)}
    )
    io.write_json(args.out, res)
    x, y = res["arms"]
    won = res.get("preferred") or res["positive"]
    print(
        f"{res['kind']} of {res['n']} pairs: {x} {won[x]}, {y} {won[y]}, "
        f"{res['discordant']} discordant, sign test p = {res['p_value']:.3g} -> {args.out}"
    )


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    {"pack": _pack_cmd, "score": _score_cmd}[args.cmd](args)


if __name__ == "__main__":
    main()
