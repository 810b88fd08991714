"""Readouts: one arm's answers to a suite's pool under one decoding regime, scored.

One parquet per (suite, arm, regime, replicate), a row per item with its verdict and structural
battery: this module is the job (its CLI, the model loaded once for a plan of regimes x
replicates, shards, what each readout records of how it was made); the rows are
arenaflow.evals.readout_rows.readout's, the file arenaflow.evals.readout_file's.

    python -m arenaflow.evals.readout readout --suite math --arm B3 --pool pools/math_eval.jsonl \
        --base-model DIR [--adapter runs/B3/final] --regime greedy --regime-json '{...}' \
        --replicate 0 --seed 0 --system-prompt S --out readouts/math/B3/greedy.r0.parquet
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from arenaflow import chat, io, jobclock, manifest, paths, tracking, verify
from arenaflow import engine as afengine
from arenaflow import schema as afschema
from arenaflow.evals.readout_file import write_readout
from arenaflow.evals.readout_rows import readout
from arenaflow.pools.validate import no_template_markers, read_pool


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser(
        "readout", help="readouts of one (suite, arm): a --plan of regimes x replicates, or one"
    )
    r.add_argument("--suite", required=True)
    r.add_argument("--arm", required=True, help="arm id, or 'base'")
    r.add_argument("--pool", required=True, help="the suite's pools/{pool}.jsonl")
    r.add_argument("--base-model", required=True)
    r.add_argument("--adapter", default=None, help="runs/{arm}/final (omit for base)")
    r.add_argument("--regime", default="", help="regime id, recorded in the metadata")
    r.add_argument("--regime-json", default=None, help="decoding settings as JSON")
    r.add_argument(
        "--plan",
        default=None,
        help="JSON list of {regime, decoding, replicate, out}: every readout of this process "
        "(instead of --regime, --regime-json, --replicate and --out)",
    )
    r.add_argument(
        "--replicate", type=int, default=0, help="replicate index; seeds seed + 1000*replicate"
    )
    suite = afschema.schema_defaults(
        "suite"
    )  # the rule passes the resolved suite's; by hand, its defaults
    r.add_argument("--seed", type=int, default=suite["seed"])
    r.add_argument("--batch-size", type=int, default=suite["batch_size"])
    r.add_argument(
        "--engine-json",
        default=None,
        help="the suite's engine settings as JSON (config `engine:`; default: the schema's)",
    )
    r.add_argument("--system-prompt", default="")
    r.add_argument(
        "--chat-template",
        default=None,
        help="base.chat_template: own, chatml or a .jinja file (default: the tokenizer's as saved)",
    )
    r.add_argument("--out", default=None, help="readouts/{suite}/{arm}/{regime}.r{rep}.parquet")
    r.add_argument(
        "--shard",
        default=None,
        help="i-of-n: read only shard i's batches of n (arenaflow.shards), each readout into "
        "its part (paths.shard_of)",
    )
    r.add_argument(
        "--tracking-json",
        default=None,
        help="config `tracking:` as resolved, JSON (arenaflow.tracking; default: none)",
    )
    return ap


def _reads(args) -> list[dict]:
    """The readouts this process makes: --plan's, or the one --regime-json/--replicate/--out
    name. Each: {regime, decoding, replicate, out}."""
    if args.plan:
        return json.loads(args.plan)
    if not (args.regime_json and args.out):
        raise SystemExit("readout: give --plan, or --regime-json and --out")
    decoding = json.loads(args.regime_json)
    return [dict(regime=args.regime, decoding=decoding, replicate=args.replicate, out=args.out)]


def _readout_cmd(args) -> None:
    """Loads the model once for every readout of the plan (an arm's regimes x replicates)."""
    with afengine.job(args.engine_json):
        _readouts(args)


def _readouts(args) -> None:
    from arenaflow import models
    from arenaflow.decode import parts as decode_parts
    from arenaflow.decode import sampling, vllm_engine
    from arenaflow.decode import warmup as decode_warmup

    reads = _reads(args)
    whole = read_pool(args.pool)
    args.verifier = verify.meta(whole)  # of the whole pool, whichever items a shard reads
    pool, args.first_batch = shard_items(whole, args.shard, args.batch_size, args.pool)
    if args.shard is not None:
        reads = [{**read, "out": paths.shard_of(read["out"], args.shard)} for read in reads]
    if not pool:  # no batches: an empty, valid part of each readout, and no model loaded
        for read in reads:
            meta = _meta(args, read, weights_read(args.adapter), 0, 0.0)
            write_readout(pd.DataFrame(), read["out"], meta)
        return
    job = reads[0]["out"]  # the job's first output, as Snakemake lists it
    batch_rows = sampling.first_batch_rows(len(pool), 1, args.batch_size)
    new_tokens = afschema.decoding_of(reads[0]["decoding"])["max_new_tokens"]
    warm = decode_warmup.start(args.base_model, batch_rows, new_tokens, afengine.get("decoder"))
    load = vllm_engine.load_policy if afengine.get("decoder") == "vllm" else models.load_policy
    model, tok = load(
        args.base_model, args.adapter, consumer="readout", job=job, chat_template=args.chat_template
    )
    no_template_markers(pool, args.pool, chat.markers(tok))
    weights = weights_read(args.adapter)
    decode_warmup.finish(warm, job)
    jobclock.loaded(job)  # start-up ends: the log line benchmarks/lineage_gpu.py reads
    tokens, seconds, tracked = 0, 0.0, {}
    for read in reads:
        n, s, correct = _read_one(args, model, tok, pool, read, weights)
        tokens, seconds = tokens + n, seconds + s
        tracked.setdefault(read["replicate"], {}).update(
            tracked_numbers(f"readout/{args.suite}/{read['regime']}", correct, n / max(s, 1e-9))
        )
    # kept until the job ends: Snakemake removes the outputs of a job that fails, those of the
    # readouts it finished too, which a rerun then reads back from their parts
    for read in reads:
        decode_parts.finish(read["out"])
    jobclock.done(job, tokens=tokens, seconds=seconds)
    tracking.summary(
        args.tracking,
        f"{args.arm}/readouts/{args.suite}" + (f"/{args.shard}" if args.shard else ""),
        kind="readout",
        tags={"arm": args.arm, "suite": args.suite, "pool": Path(args.pool).stem},
        metrics=tracked,  # by replicate
    )


def tracked_numbers(prefix: str, correct: np.ndarray, tokens_per_s: float) -> dict:
    """A readout's accuracy with its Wilson 95 % interval, and its throughput, for the trackers."""
    from scipy.stats import binomtest

    n, k = len(correct), int(np.sum(correct))
    ci = binomtest(k, n).proportion_ci(0.95, method="wilson") if n else None
    return {
        f"{prefix}/accuracy": k / n if n else None,
        f"{prefix}/accuracy_ci95_low": ci.low if ci else None,
        f"{prefix}/accuracy_ci95_high": ci.high if ci else None,
        f"{prefix}/items": n,
        f"{prefix}/tokens_per_s": tokens_per_s,
    }


def weights_read(run_dir: str | None) -> dict | None:
    """What a readout records of the weights it read: the run directory and its manifest's
    digest (verified against the files when the policy was loaded), and the digest of the corpus
    the run trained on. None for the base, whose weights the config's revision names."""
    if run_dir is None:
        return None
    record = io.read_json(Path(run_dir) / manifest.MANIFEST)
    evidence = Path(run_dir) / "training_evidence.json"
    trained_on = io.read_json(evidence).get("dataset_sha256") if evidence.exists() else None
    return {"run": str(run_dir), "manifest_digest": record["digest"], "corpus_digest": trained_on}


def _read_one(
    args, model, tok, pool: list[dict], read: dict, weights: dict | None
) -> tuple[int, float, np.ndarray]:
    """One (regime, replicate) readout written to read['out']: (tokens, seconds of work, each
    item's correctness)."""
    from arenaflow.decode import parts as decode_parts
    from arenaflow.decode import vllm_engine

    decoded_by = vllm_engine.describe(afengine.get("decoder"), model)
    seed = args.seed + 1000 * read["replicate"]
    job = decode_parts.Job(read["out"], decode_parts.weights_of(args.base_model, args.adapter))
    t0 = time.perf_counter()
    df = readout(
        pool,
        model,
        tok,
        read.get("system_prompt", args.system_prompt),  # the plan's, per regime
        read["decoding"],
        seed,
        args.batch_size,
        desc=f"readout {args.suite}/{args.arm}/{read['regime']}.r{read['replicate']}",
        engine=afengine.get("decoder"),
        job=job,
        first_batch=args.first_batch,
    )
    seconds = time.perf_counter() - t0  # decoding and scoring
    df.insert(0, "arm", args.arm)
    df["replicate"] = read["replicate"]
    tokens = int(df["n_tokens"].sum())
    meta = _meta(args, read, weights, tokens, seconds)
    template = chat.template_record(tok, args.chat_template)
    write_readout(df, read["out"], {**meta, "decoded_by": decoded_by, "chat_template": template})
    print(
        f"{args.suite}/{args.arm}: accuracy {df['correct'].mean():.4f} on {len(df)} items "
        f"-> {read['out']}"
    )
    return tokens, seconds, df["correct"].to_numpy(bool)


def _meta(args, read: dict, weights: dict | None, tokens: int, seconds: float) -> dict:
    """What a readout records of how it was made (write_readout adds when, and the code)."""
    return {
        "suite": args.suite,
        "arm": args.arm,
        "regime": read["regime"],
        "decoding": read["decoding"],
        "system_prompt": read.get("system_prompt", args.system_prompt),
        "replicate": read["replicate"],
        "seed": args.seed + 1000 * read["replicate"],
        "batch_size": args.batch_size,
        "engine": afengine.settings(),
        "decoded_by": {"decoder": afengine.get("decoder")},  # _read_one's, from its model
        "weights": weights,
        "pool": args.pool,
        "tokens": tokens,
        "seconds": round(seconds, 3),
        **args.verifier,
    }


def shard_items(
    pool: list[dict], shard: str | None, batch_size: int, where: str
) -> tuple[list[dict], int]:
    """The items shard `shard` ('i-of-n'; None: all) of pool file `where` reads, and the index
    of their first batch (arenaflow.shards); a multi-turn pool raises ValueError naming it."""
    from arenaflow import shards

    if shard is None:
        return pool, 0
    if any("turns" in r for r in pool):
        raise ValueError(
            f"readout --shard {shard}: {where} is a multi-turn pool, read turn by turn over "
            "every conversation; its suite takes `shards: 1`"
        )
    s = shards.span(len(pool), batch_size, *shards.parse(shard))  # k = 1: a row an item
    return pool[s.start : s.stop], s.first_batch


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    args.tracking = tracking.from_json(args.tracking_json)
    {"readout": _readout_cmd}[args.cmd](args)


if __name__ == "__main__":
    main()
