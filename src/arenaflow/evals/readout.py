"""Readouts: one arm's answers to a suite's pool under one decoding regime, scored.

One parquet per (suite, arm, regime, replicate), a row per item with its verdict and structural
battery (see readout()).

    python -m arenaflow.evals.readout readout --suite math --arm B3 --pool pools/math_eval.jsonl \
        --base-model DIR [--adapter runs/B3/final] --regime greedy --regime-json '{...}' \
        --replicate 0 --seed 0 --system-prompt S --out readouts/math/B3/greedy.r0.parquet
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from arenaflow import chat, io, jobclock, manifest, paths, tracking, verify
from arenaflow import engine as afengine
from arenaflow import schema as afschema
from arenaflow.evals import degeneracy, stats
from arenaflow.evals.cluster import cluster_of_row
from arenaflow.instruct import families, multiturn, toolleak
from arenaflow.pools.validate import no_template_markers, read_pool

# Lineage 000's scorer predicate: rep_ratio(n=6) >= 0.25 (one definition:
# arenaflow.evals.degeneracy;
# docs/lineages.md#000-two-repetition-measures)
LOOP_AT = degeneracy.LOOP_THRESHOLD
rep_ratio = degeneracy.rep_ratio
META_KEY = b"arenaflow"


def structure(df: pd.DataFrame) -> pd.DataFrame:
    """Add the structural battery columns from completion, n_tokens and stopped: the
    per-sample flags are arenaflow.evals.degeneracy.flags (the readout keeps truncated, empty, loop
    and
    fffd; low_unique is the corpus builder's filter, not a readout column)."""
    df = df.copy()
    text = df["completion"].fillna("")
    flags = pd.DataFrame(
        [degeneracy.flags(t, bool(s)) for t, s in zip(text, df["stopped"])],
        index=df.index,
        columns=["truncated", "empty", "loop", "fffd"],
        dtype=bool,
    )
    df["truncated"] = flags["truncated"]
    df["empty"] = flags["empty"]
    df["rep_ratio6"] = text.map(rep_ratio)
    df["loop"] = flags["loop"]
    df["fffd"] = flags["fffd"]
    df["n_words"] = text.map(lambda s: len(s.split()))
    # lineage 002's tool-leak audit and answer-usable read (arenaflow.instruct.toolleak, degeneracy)
    df["tool_leak"] = text.map(lambda s: toolleak.leak(s) is not None).astype(bool)
    df["answer_usable"] = pd.Series(
        [degeneracy.answer_usable(t, bool(s)) for t, s in zip(text, df["stopped"])],
        index=df.index,
        dtype=bool,
    )
    return df


def target_of(row: dict) -> str:
    """What an item is scored against, as text: gold answer, constraint list, or the open-ended
    length floor, so both sides of a comparison can prove they judged the same thing."""
    if "gold" in row:
        return row["gold"]
    if "constraints" in row:
        return json.dumps(row["constraints"], sort_keys=True)
    return json.dumps({"open": True, "min_chars": row.get("min_chars", 0)})


def readout(
    pool: list[dict],
    model,
    tokenizer,
    system_prompt: str,
    regime: dict,
    seed: int,
    batch_size: int,
    desc: str,
    engine: str = "hf",
    job=None,
    first_batch: int = 0,
) -> pd.DataFrame:
    """One row per item. `correct` is the same verdict rejection sampling uses
    (arenaflow.candidates.verdict): math, verify.check's `correct`; instruction following, every
    constraint checked; open-ended, stopped, non-degenerate and long enough.

    A readout is one parquet per (suite, arm, regime, replicate), one row per item (per
    conversation x turn for a multi-turn pool: arenaflow.instruct.multiturn), carrying the
    prompt and target hashes so a comparison can prove both sides saw the same items, and the
    structural battery per answer (stopped, truncated, empty, loop by rep_ratio(6) >= 0.25, U+FFFD,
    words, tokens, tool_leak: arenaflow.instruct.toolleak, answer_usable: degeneracy.answer_usable),
    and on items with constraints each constraint's verdict (`checks`,
    arenaflow.instruct.families). Replicate r decodes with seed + 1000 * r; the same seed gives
    identical rows. The parquet's schema metadata (key "arenaflow") records when and how it was
    made (for a math suite, `verifier`: arenaflow.verify.verifier): nomination checks
    `created_utc` against the bar's registration time. With `job` (arenaflow.decode.parts.Job),
    finished batches are kept beside job.out and a rerun after a kill decodes only the rest (not
    for a multi-turn pool: a turn's prompts hold the earlier turns' answers). A shard's `pool`
    is its items and `first_batch` the index of their first batch in the whole pool
    (arenaflow.shards)."""
    from arenaflow import candidates, chat
    from arenaflow.decode import sampling  # torch-heavy: only the readout needs them

    dec = sampling.Decoding(**afschema.decoding_of(regime))
    if any(
        "turns" in r for r in pool
    ):  # conversations, read turn by turn (arenaflow.instruct.multiturn)
        args = (system_prompt, dec, seed, batch_size, desc, engine)
        return structure(
            pd.DataFrame.from_records(multiturn.readout(pool, model, tokenizer, *args))
        )
    fmt = chat.format_of(tokenizer)
    prompts = [
        chat.render(chat.row_messages(system_prompt, r), True, fmt) for r in pool
    ]  # +context
    # sampling.generate prints one progress line per batch (prompts done, tok/s, elapsed)
    outs = sampling.generate(
        model,
        tokenizer,
        prompts,
        dec,
        k=1,
        seed=seed,
        batch_size=batch_size,
        desc=desc,
        engine=engine,
        job=job,
        first_batch=first_batch,
    )
    recs = []
    for r, p, (o,) in zip(pool, prompts, outs):
        v = candidates.verdict({"id": r["id"], "prompt_id": r["id"], "sample": 0, **o}, r)
        recs.append(
            {
                "item_id": r["id"],
                "category": r["category"],
                "cluster": cluster_of_row(r),  # what its SE is clustered by (evals.cluster)
                "prompt_sha256": manifest.sha256_text(p),
                "target_sha256": manifest.sha256_text(target_of(r)),
                "completion": o["text"],
                "n_tokens": o["n_tokens"],
                "stopped": o["stopped"],
                "pred": v.get("pred"),
                "strict": v.get("strict", v["correct"]),
                "reasons": "; ".join(v.get("reasons", [])),
                "correct": v["correct"],
                # per-constraint verdicts, for the per-family table (arenaflow.instruct.families)
                "checks": families.checks_of(o["text"], r["constraints"])
                if "constraints" in r
                else None,
            }
        )
    return structure(pd.DataFrame.from_records(recs))


def write_readout(df: pd.DataFrame, path: str | Path, meta: dict) -> None:
    """Parquet with arenaflow's metadata (created_utc, ...) in the schema, not in the rows, so
    two readouts of the same seed have identical rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
    record = {**meta, "created_utc": created, "code": manifest.code_version()}
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), META_KEY: json.dumps(record, sort_keys=True).encode()}
    )
    with io.atomic_path(path) as tmp:
        # CRC32 per page: a reader that asks (load) refuses a flipped bit instead of scoring it
        pq.write_table(table, tmp, write_page_checksum=True)


def readout_meta(path: str | Path) -> dict:
    """arenaflow's metadata of a readout parquet ({} for readouts written before it existed)."""
    import pyarrow.parquet as pq

    raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
    return json.loads(raw) if raw else {}


def outcomes(df: pd.DataFrame, col: str, name: str) -> np.ndarray:
    """df[col] as bools; a value other than 0/1 (NaN included, which bool() would call correct)
    raises ValueError naming `name` and the offending row's item and replicate."""
    items = df["item_id"] if "item_id" in df else pd.Series(range(len(df)), index=df.index)
    reps = df["replicate"] if "replicate" in df else [None] * len(df)
    labels = [
        f"item {i!r}" + ("" if r is None else f", replicate {r}") for i, r in zip(items, reps)
    ]
    return stats.binary(df[col].to_numpy(), f"{name} ({col!r})", labels=labels)


def read_readout(path: str | Path) -> pd.DataFrame:
    """A readout, its page checksums verified (readouts written before they had checksums are
    read as they are) and its recorded identity matching its path (check_named); a bad page or
    a readout under another's name raises ManifestError naming the file."""
    try:
        df = pd.read_parquet(path, page_checksum_verification=True)
    except OSError as e:
        raise manifest.ManifestError(f"{path}: unreadable readout: {e}") from None
    check_named(path, readout_meta(path), df)
    return df


# what a readout's path says of it -> the metadata key that records it
NAMED = {"suite": "suite", "rarm": "arm", "regime": "regime", "rep": "replicate"}


def check_named(path: str | Path, meta: dict, df: pd.DataFrame) -> None:
    """A readout under readouts/{suite}/{arm}/{regime}.r{rep}.parquet must record that suite,
    arm, regime and replicate, and its rows that arm and replicate: a readout copied over
    another (the served regime's over the greedy one's, one replicate over another, one arm's
    over another's) would otherwise be compared under the name it was copied to."""
    named = paths.parse(paths.READOUT, path)
    if named is None or not meta:  # not in the layout, or written before metadata existed
        return
    for key, field in NAMED.items():
        if str(meta.get(field)) != named[key]:
            raise manifest.ManifestError(
                f"{path}: records {field} {meta.get(field)!r}, its path says {named[key]!r} "
                "(a readout copied or moved under another's name)"
            )
    for col, want in (("arm", named["rarm"]), ("replicate", named["rep"])):
        if col in df and set(map(str, df[col].unique())) - {want}:
            raise manifest.ManifestError(
                f"{path}: rows of {col} {sorted(set(map(str, df[col].unique())))}, "
                f"its path says {want!r}"
            )


def structured(df: pd.DataFrame) -> pd.DataFrame:
    """A readout with its structural battery: as written, or, for a readout made before a column
    of it existed (answer_usable), recomputed by structure()."""
    return df if "answer_usable" in df.columns else structure(df)


def load(paths: list[str]) -> pd.DataFrame:
    frames = []
    for p in paths:
        df = read_readout(p)
        outcomes(df, "correct", str(p))  # name the readout file before its rows are pooled
        frames.append(structured(df))
    return pd.concat(frames, ignore_index=True)


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
