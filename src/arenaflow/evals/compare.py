"""Paired comparisons and noise floors of readouts.

Readout parquets (arenaflow.evals.readout) of the same items in, a sealed JSON of paired
statistics out: every replicate pooled, each on its own, and the paired t over replicates
(arenaflow.evals.stats explains each t).

    python -m arenaflow.evals.compare compare --suite math --regime served \
        --cand B3.r0.parquet B3.r1.parquet --ref R2d.r0.parquet R2d.r1.parquet \
        --out compare/math/served/B3__R2d.json
    python -m arenaflow.evals.compare noise --suite math --regime served \
        --readouts R2d.r0.parquet R2d.r1.parquet R2d.r2.parquet --out noise/math/served/R2d.json
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from arenaflow import io, manifest
from arenaflow.evals import cluster, stats
from arenaflow.evals.readout_file import load, outcomes, readout_meta
from arenaflow.instruct import families, multiturn
from arenaflow.rounds import bar as afbar

# Per-side levels of a comparison (levels() below), in points for rates: the level metrics a
# bar's clause may name, defined once in arenaflow.rounds.bar.
LEVELS = afbar.LEVELS


def levels(df: pd.DataFrame) -> dict:
    """One side's levels over all its rows: rates in points, means in words/tokens. A rate
    whose column a hand-made frame lacks is None (a bar clause on it is then undefined)."""

    def pct(col: str) -> float | None:
        if col not in df:
            return None
        return float(df[col].astype(bool).mean() * 100) if len(df) else 0.0

    return {
        "accuracy": pct("correct"),
        "truncation_rate": pct("truncated"),
        "empty_rate": pct("empty"),
        "loop_rate": pct("loop"),
        "fffd_rate": pct("fffd"),
        "tool_leak_rate": pct("tool_leak"),
        "answer_usable_rate": pct("answer_usable"),
        "mean_words": float(df["n_words"].mean()) if len(df) else 0.0,
        "mean_tokens": float(df["n_tokens"].mean()) if len(df) else 0.0,
    }


def paired_rows(cand: pd.DataFrame, ref: pd.DataFrame, where: str) -> pd.DataFrame:
    m = cand.merge(
        ref, on=["item_id", "replicate"], suffixes=("", "_ref"), how="outer", indicator=True
    )
    unpaired = m[m["_merge"] != "both"]
    if len(unpaired):
        raise ValueError(
            f"{where}: {len(unpaired)} (item, replicate) pairs are read out on one side "
            f"only, e.g. {unpaired['item_id'].iloc[0]!r}"
        )
    bad = m[
        (m["prompt_sha256"] != m["prompt_sha256_ref"])
        | (m["target_sha256"] != m["target_sha256_ref"])
    ]
    if len(bad):
        raise ValueError(
            f"{where}: item {bad['item_id'].iloc[0]!r} has a different prompt or target "
            "on the two sides; readouts of different suites cannot be paired"
        )
    return m


def compare(cand: pd.DataFrame, ref: pd.DataFrame, where: str) -> dict:
    """Paired statistics pooled over replicates, per replicate, and per category; items (and
    replicate indices) must match one to one."""
    m = paired_rows(cand, ref, where)
    sides = (f"{where}: candidate {_arms(cand)}", f"{where}: reference {_arms(ref)}")
    m["correct"] = outcomes(m, "correct", sides[0])
    m["correct_ref"] = outcomes(m, "correct_ref", sides[1])
    extra = {}
    if "checks" in cand.columns and "checks" in ref.columns:  # an ifeval suite's readouts
        by_family = families.table(m, where)  # at check level, turn by turn in conversations
        if by_family:
            extra = {"by_family": by_family, **families.summary(by_family)}
    if "conversation" in m.columns:  # multi-turn: the outcome is "every turn passes"
        extra["by_turn"] = multiturn.by_turn(m)
        m = multiturn.conversations(m)
    out = _paired(m, sides, "")
    labels, by = cluster.clusters_of(m)  # an item's K replicates always share a cluster
    diff = m["correct"].to_numpy(float) - m["correct_ref"].to_numpy(float)
    out["clustered"] = cluster.paired_clustered(diff, labels, by)
    out["by_category"] = {
        c: _paired(g, sides, f", category {c!r}") for c, g in m.groupby("category", sort=True)
    }
    per_rep = {
        r: _paired(g, sides, f", replicate {r}") for r, g in m.groupby("replicate", sort=True)
    }
    out["by_replicate"] = [
        {"replicate": int(r), **{k: p[k] for k in _PER_REPLICATE}} for r, p in per_rep.items()
    ]
    out.update(
        stats.t_over_replicates(
            [p["accuracy"] for p in per_rep.values()],
            [p["ref_accuracy"] for p in per_rep.values()],
            name=f"{where}: t over replicates",
        )
    )
    if {"n_words", "loop"} <= set(cand.columns) & set(ref.columns):  # the structural battery
        out.update(_battery(m, cand, ref, out["by_category"], sides))
    out.update(extra)
    out["replicates"] = int(m["replicate"].nunique())
    return out


def _paired(m: pd.DataFrame, sides: tuple[str, str], part: str, col: str = "correct") -> dict:
    """stats.paired of `col` against `col`_ref in `m`; an error names both sides' readouts."""
    return stats.paired(
        m[col].to_numpy(),
        m[f"{col}_ref"].to_numpy(),
        names=(f"{sides[0]}{part} ({col!r})", f"{sides[1]}{part} ({col + '_ref'!r})"),
    )


_PER_REPLICATE = ("accuracy", "ref_accuracy", "delta", "wins", "losses", "p_value", "t_items")


_USABLE = ("n", "accuracy", "ref_accuracy", "delta", "wins", "losses", "p_value")


def _battery(
    m: pd.DataFrame, cand: pd.DataFrame, ref: pd.DataFrame, by_category: dict, sides: tuple
) -> dict:
    """The structural battery's paired word counts and each side's levels, overall and per
    category (written into `by_category`)."""
    words = m["n_words"].to_numpy(float) - m["n_words_ref"].to_numpy(float)
    name = f"{sides[0]} vs {sides[1]}: words per answer ('n_words' - 'n_words_ref')"
    out = {"words_delta": float(stats.finite(words, name).mean())}
    out["words_t"], out["words_t_p_value"] = stats.t_one_sample(words, name)
    out["words_sign_p"] = stats.sign_test(words, name)
    out["levels"] = {"cand": levels(cand), "ref": levels(ref)}
    if "answer_usable" in m and "answer_usable_ref" in m:  # paired, as lineage 002 read it
        usable = _paired(m, sides, "", "answer_usable")
        out["answer_usable"] = {k: usable[k] for k in _USABLE}
    for c in by_category:  # the battery's rates and lengths per category too
        by_category[c]["levels"] = {
            "cand": levels(cand[cand["category"] == c]),
            "ref": levels(ref[ref["category"] == c]),
        }
    return out


def _arms(df: pd.DataFrame) -> str:
    return "/".join(map(str, df["arm"].unique())) + " readouts" if "arm" in df else "readouts"


def noise(readouts: pd.DataFrame, where: str) -> dict:
    """Self vs self: the K replicates of one arm, paired by item
    (arenaflow.evals.stats.noise_floor)."""
    outcomes(readouts, "correct", f"{where}: {_arms(readouts)}")  # before NaN or 2 become True
    wide = readouts.pivot(index="item_id", columns="replicate", values="correct")
    if wide.isna().any().any():
        raise ValueError(f"{where}: replicates do not cover the same items")
    hashes = readouts.groupby("item_id")["prompt_sha256"].nunique()
    if (hashes > 1).any():
        raise ValueError(
            f"{where}: item {hashes[hashes > 1].index[0]!r} has different prompts across replicates"
        )
    out = stats.noise_floor(wide.to_numpy(dtype=bool).T, f"{where}: {_arms(readouts)}")
    out["replicate_ids"] = [int(c) for c in wide.columns]
    return out


def _sources(paths: list[str]) -> list[dict]:
    """The sha256 of every pooled readout, so nomination can tell they are still what was
    pooled, and the weights each read: one arm's replicates must all have read the same."""
    out = []
    for p in paths:
        meta = readout_meta(p)
        out.append(
            {
                "path": p,
                "created_utc": meta.get("created_utc"),
                "sha256": manifest.sha256_file(p),
                "weights": meta.get("weights"),
            }
        )
    digests = {(s["weights"] or {}).get("manifest_digest") for s in out}
    if len(digests) > 1:
        raise manifest.ManifestError(
            f"{paths[0]}: the pooled readouts read different weights "
            f"({sorted(map(str, digests))}): one was made from another run of the arm, or "
            "copied from another arm"
        )
    return out


def pooled(record: dict) -> list[dict]:
    """The readout sources a compare or noise record pooled."""
    r = record.get("readouts", [])
    return [*r.get("cand", []), *r.get("ref", [])] if isinstance(r, dict) else list(r)


def finite_record(record, path: str | Path) -> dict:
    """`record`, a compare or noise JSON read from `path`, once none of its numbers is NaN or inf
    (a file written before the statistics refused them); ValueError naming the file and the key
    otherwise, before a bar, a report or a card reads the number."""

    def walk(value, key: str) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{path}: {key} is {value}; recompute the file from its readouts")
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}/{k}" if key else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")

    walk(record, "")
    return record


def verify_pooled(path: str | Path) -> dict:
    """A compare or noise JSON, once its seal holds and every readout it pooled still has the
    sha256 recorded then; ManifestError names the file that changed. Returns the record."""
    record = finite_record(manifest.check_seal(io.read_json(path), path), path)
    for src in pooled(record):
        manifest.check_file(src["path"], src["sha256"], path)
    return record


def verify_judged(compare: list[str], noise: list[str], readouts: list[str]) -> None:
    """What nomination reads: every compare and noise JSON (verify_pooled), and each readout it
    judges must be one of those pooled, with the same sha256."""
    known = {}
    for path in [*compare, *noise]:
        for src in pooled(verify_pooled(path)):
            known[Path(src["path"])] = path
    stray = [p for p in readouts if Path(p) not in known]
    if stray:
        raise manifest.ManifestError(
            f"{stray[0]}: judged but pooled by none of the compare or noise "
            "files given, so nothing records its sha256"
        )


def _compare_cmd(args) -> None:
    cand, ref = load(args.cand), load(args.ref)
    res = compare(cand, ref, args.out)
    res.update(
        suite=args.suite,
        regime=args.regime,
        cand=str(cand["arm"].iloc[0]),
        ref=str(ref["arm"].iloc[0]),
        readouts={"cand": _sources(args.cand), "ref": _sources(args.ref)},
    )
    io.write_json(args.out, manifest.seal(res))
    t = "n/a" if res["t"] is None else f"{res['t']:+.2f}"
    cl = res["clustered"]
    ses = [cl[k]["se"] for k in ("items", "clustered")]
    se = " / ".join("n/a" if x is None else f"{x:.2f}" for x in ses)
    print(
        f"{res['cand']} vs {res['ref']}: delta {res['delta']:+.2f} pt, "
        f"W/L {res['wins']}/{res['losses']}, "
        f"p = {res['p_value']:.3g}, t over {res['replicates']} replicates {t}, "
        f"SE items / {cl['n_clusters']} clusters {se} pt"
    )


def _noise_cmd(args) -> None:
    df = load(args.readouts)
    arms = sorted(df["arm"].unique())
    if len(arms) != 1:
        raise SystemExit(f"{args.out}: a noise floor is one arm against itself; got arms {arms}")
    if df["replicate"].nunique() < 2:
        raise SystemExit(
            f"{args.out}: a noise floor needs >= 2 replicates; set the regime's "
            "replicates to K >= 2 in config evals"
        )
    res = noise(df, args.out)
    res.update(suite=args.suite, regime=args.regime, arm=arms[0], readouts=_sources(args.readouts))
    io.write_json(args.out, manifest.seal(res))
    t = "n/a" if res["max_abs_t"] is None else f"{res['max_abs_t']:.2f}"
    print(
        f"{arms[0]} vs itself over {res['k']} replicates: accuracies "
        f"{' / '.join(f'{a:.2f}' for a in res['replicate_accuracies'])}, "
        f"spread {res['spread']:.2f} pt, "
        f"mean |delta| {res['mean_abs_delta']:.2f} pt, max |t| {t}"
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="paired statistics of a candidate against a reference")
    c.add_argument("--suite", default=None)
    c.add_argument("--regime", default=None)
    c.add_argument("--cand", nargs="+", required=True, help="candidate readouts, one per replicate")
    c.add_argument("--ref", nargs="+", required=True, help="reference readouts, one per replicate")
    c.add_argument("--out", required=True, help="compare/{suite}/{regime}/{cand}__{ref}.json")
    n = sub.add_parser("noise", help="noise floor: one arm's K replicates against each other")
    n.add_argument("--suite", default=None)
    n.add_argument("--regime", default=None)
    n.add_argument(
        "--readouts", nargs="+", required=True, help="the arm's K >= 2 replicate readouts"
    )
    n.add_argument("--out", required=True, help="noise/{suite}/{regime}/{arm}.json")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    {"compare": _compare_cmd, "noise": _noise_cmd}[args.cmd](args)


if __name__ == "__main__":
    main()
