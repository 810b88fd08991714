"""Readouts and paired comparisons.

    python -m arenaflow.evals readout --suite math --arm B3 --pool pools/math_eval.jsonl \
        --base-model DIR [--adapter runs/B3/final] --regime-json '{...}' --replicate 0 --seed 0 \
        --system-prompt S --out readouts/math/B3/greedy.r0.parquet
    python -m arenaflow.evals compare --cand A.parquet --ref B.parquet --out compare/...json

A readout is one parquet per (suite, arm, regime, replicate), one row per item, carrying the
prompt and target hashes so a comparison can prove both sides saw the same items.
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from arenaflow import chat, io, manifest, models, sampling, stats, verify


def readout(pool: list[dict], model, tokenizer, system_prompt: str, regime: dict, seed: int,
            batch_size: int, desc: str) -> pd.DataFrame:
    prompts = [chat.render(chat.prompt_messages(system_prompt, r["prompt"]), True) for r in pool]
    dec = sampling.Decoding(**regime)
    outs = sampling.generate(model, tokenizer, prompts, dec, k=1, seed=seed,
                             batch_size=batch_size, desc=desc)
    recs = []
    for r, p, (o,) in zip(pool, prompts, outs):
        v = verify.check(o["text"], r["gold"])
        recs.append({
            "item_id": r["id"],
            "category": r["category"],
            "prompt_sha256": manifest.sha256_text(p),
            "target_sha256": manifest.sha256_text(r["gold"]),
            "completion": o["text"],
            "n_tokens": o["n_tokens"],
            "stopped": o["stopped"],
            "empty": not o["text"].strip(),
            "pred": v["pred"],
            "strict": v["strict"],
            "correct": v["loose"],
        })
    return pd.DataFrame.from_records(recs)


def compare(cand: pd.DataFrame, ref: pd.DataFrame, where: str) -> dict:
    """Paired statistics, overall and per category; items must match one to one."""
    m = cand.merge(ref, on=["item_id", "replicate"], suffixes=("", "_ref"), how="outer", indicator=True)
    unpaired = m[m["_merge"] != "both"]
    if len(unpaired):
        raise ValueError(f"{where}: {len(unpaired)} (item, replicate) pairs are read out on one side "
                         f"only, e.g. {unpaired['item_id'].iloc[0]!r}")
    bad = m[(m["prompt_sha256"] != m["prompt_sha256_ref"]) | (m["target_sha256"] != m["target_sha256_ref"])]
    if len(bad):
        raise ValueError(f"{where}: item {bad['item_id'].iloc[0]!r} has a different prompt or target "
                         "on the two sides; readouts of different suites cannot be paired")
    out = stats.paired(m["correct"].to_numpy(), m["correct_ref"].to_numpy())
    out["by_category"] = {
        c: stats.paired(g["correct"].to_numpy(), g["correct_ref"].to_numpy())
        for c, g in m.groupby("category", sort=True)
    }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("readout", help="one (suite, arm, regime, replicate) readout")
    r.add_argument("--suite", required=True)
    r.add_argument("--arm", required=True, help="arm id, or 'base'")
    r.add_argument("--pool", required=True, help="the suite's pools/{pool}.jsonl")
    r.add_argument("--base-model", required=True)
    r.add_argument("--adapter", default=None, help="runs/{arm}/final (omit for base)")
    r.add_argument("--regime-json", required=True, help="decoding settings as JSON")
    r.add_argument("--replicate", type=int, default=0, help="replicate index; seeds seed + 1000*replicate")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--batch-size", type=int, default=256)
    r.add_argument("--system-prompt", default="")
    r.add_argument("--out", required=True, help="readouts/{suite}/{arm}/{regime}.r{rep}.parquet")
    c = sub.add_parser("compare", help="paired statistics of a candidate against a reference")
    c.add_argument("--cand", nargs="+", required=True, help="candidate readouts, one per replicate")
    c.add_argument("--ref", nargs="+", required=True, help="reference readouts, one per replicate")
    c.add_argument("--out", required=True, help="compare/{suite}/{regime}/{cand}__{ref}.json")
    args = ap.parse_args(argv)
    if args.cmd == "readout":
        model, tok = models.load_policy(args.base_model, args.adapter)
        df = readout(io.read_jsonl(args.pool), model, tok, args.system_prompt,
                     json.loads(args.regime_json), args.seed + 1000 * args.replicate,
                     args.batch_size, desc=f"readout {args.suite}/{args.arm}")
        df.insert(0, "arm", args.arm)
        df["replicate"] = args.replicate
        with io.atomic_path(args.out) as tmp:
            df.to_parquet(tmp, index=False)
        print(f"{args.suite}/{args.arm}: accuracy {df['correct'].mean():.4f} on {len(df)} items -> {args.out}")
    else:
        cand = pd.concat([pd.read_parquet(p) for p in args.cand], ignore_index=True)
        ref = pd.concat([pd.read_parquet(p) for p in args.ref], ignore_index=True)
        res = compare(cand, ref, args.out)
        res.update(cand=str(cand["arm"].iloc[0]), ref=str(ref["arm"].iloc[0]),
                   replicates=int(cand["replicate"].nunique()))
        io.write_json(args.out, res)
        print(f"{res['cand']} vs {res['ref']}: delta {res['delta']:+.2f} pt, W/L {res['wins']}/{res['losses']}, "
              f"p = {res['p_value']:.3g}")


if __name__ == "__main__":
    main()
