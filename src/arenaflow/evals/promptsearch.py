"""System-prompt search: one set of weights read out under N candidate system prompts.

    python -m arenaflow.evals.promptsearch --search S --arm A --readouts none=R.r0.parquet
        --readouts k0=K0.r0.parquet --readouts k1=K1.r0.parquet
        --prompts-json '{"none": "", "k0": "...", "k1": "..."}' --out prompt_search/S.json

Lineage 003 chose its served prompt k0 from a 10-candidate search on one weight set, each
candidate paired against no system prompt and the later rewrites against k0 by an exact McNemar
test over the same items (docs/lineages.md#003-system-prompt-search). Here a suite's
`system_prompts: {k0: text, ...}` gives each of its regimes R search regimes R-k0, ... and R-none
(no system prompt; arenaflow.config.regime), read out only for a search, and `prompt_search:
{S: {suite, regime, arm}}` reads the arm under each. Readouts of one item under two prompts have
different prompt hashes by design: they are paired by item and replicate, and must share the
item's target hash.

The JSON (sealed, with each readout's sha256): `table`, one row per candidate in config order
(correct, n, accuracy in points, and against `none`: delta, wins, losses, exact McNemar p),
`pairs`, every candidate against every other (a against b: wins = items a gets right and b
wrong), and `chosen`: the candidate with the most correct, `none` included (on a tie: none,
then the first in config order), with its text ('' for none), which a bundle with
`system_prompt: {search: S}` serves.
"""

from __future__ import annotations

import argparse
import itertools
import json

import pandas as pd

from arenaflow import io, manifest
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout_file, stats

NONE = "none"


def _paired(a: pd.DataFrame, b: pd.DataFrame, where: str) -> dict:
    """Exact McNemar of a against b, paired by (item, replicate) on the same targets."""
    m = a.merge(b, on=["item_id", "replicate"], suffixes=("", "_b"), how="outer", indicator=True)
    if (m["_merge"] != "both").any():
        item = m.loc[m["_merge"] != "both", "item_id"].iloc[0]
        raise ValueError(f"{where}: item {item!r} is read out under one prompt only")
    bad = m[m["target_sha256"] != m["target_sha256_b"]]
    if len(bad):
        raise ValueError(f"{where}: item {bad['item_id'].iloc[0]!r} has different targets")
    p = stats.paired(
        readout_file.outcomes(m, "correct", where),
        readout_file.outcomes(m, "correct_b", where),
        names=(f"{where}: a", f"{where}: b"),
    )
    return {
        k: p[k] for k in ("n", "accuracy", "ref_accuracy", "delta", "wins", "losses", "p_value")
    }


def search(readouts: dict[str, pd.DataFrame], order: list[str]) -> dict:
    """The table, every pair, and the chosen candidate (most correct; first on a tie)."""
    missing = [k for k in [NONE, *order] if k not in readouts]
    if missing:
        raise ValueError(f"no readouts for candidate(s) {missing}")
    table = []
    for k in [NONE, *order]:
        df = readouts[k]
        correct = int(readout_file.outcomes(df, "correct", k).sum())
        row = {"prompt": k, "correct": correct, "n": len(df), "accuracy": 100 * correct / len(df)}
        if k != NONE:
            vs = _paired(df, readouts[NONE], f"{k} vs {NONE}")
            row.update(vs_none={x: vs[x] for x in ("delta", "wins", "losses", "p_value")})
        table.append(row)
    pairs = [
        {"a": a, "b": b, **_paired(readouts[a], readouts[b], f"{a} vs {b}")}
        for a, b in itertools.combinations(order, 2)
    ]
    # none too: a prompt that reads worse than no prompt is not served; max keeps the first of
    # equal ones, so none wins a tie (no prompt without evidence for one)
    best = max(table, key=lambda r: r["correct"])
    return {"table": table, "pairs": pairs, "chosen": best["prompt"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--search", required=True, help="the search's id")
    ap.add_argument("--arm", required=True, help="the arm whose weights were read out")
    ap.add_argument(
        "--readouts", action="append", required=True, help="KEY=PATH, once per replicate"
    )
    ap.add_argument("--prompts-json", required=True, help='{"none": "", "k0": text, ...}')
    ap.add_argument("--out", required=True, help="prompt_search/{search}.json")
    args = ap.parse_args(argv)
    prompts = json.loads(args.prompts_json)
    paths: dict[str, list[str]] = {}
    for spec in args.readouts:
        key, sep, path = spec.partition("=")
        if not sep or key not in prompts:
            raise SystemExit(f"--readouts {spec!r}: expected KEY=PATH, KEY one of {list(prompts)}")
        paths.setdefault(key, []).append(path)
    order = [k for k in prompts if k != NONE]
    res = search({k: readout_file.load(v) for k, v in paths.items()}, order)
    res.update(
        search=args.search,
        arm=args.arm,
        prompts=prompts,
        chosen_text=prompts[res["chosen"]],
        readouts={k: comparisons._sources(v) for k, v in paths.items()},
    )
    io.write_json(args.out, manifest.seal(res))
    for row in res["table"]:
        vs = row.get("vs_none")
        extra = f"  vs none {vs['wins']}/{vs['losses']} p = {vs['p_value']:.3g}" if vs else ""
        print(f"{row['prompt']:>12}: {row['correct']}/{row['n']}{extra}")
    print(f"chosen: {res['chosen']} -> {args.out}")


if __name__ == "__main__":
    main()
