"""A readout's rows: one arm's answers to a suite's pool under one decoding regime, each scored
(the verdict rejection sampling uses) with its structural battery. Separate from the job
(arenaflow.evals.readout: the CLI, model loading, plans and shards) and from the file
(arenaflow.evals.readout_file): these rows are what tests and analyses build and rescore without
a model or a parquet on disk.
"""

from __future__ import annotations

import json

import pandas as pd

from arenaflow import manifest
from arenaflow import schema as afschema
from arenaflow.evals import degeneracy
from arenaflow.evals.cluster import cluster_of_row
from arenaflow.instruct import families, multiturn, toolleak

# Lineage 000's scorer predicate: rep_ratio(n=6) >= 0.25 (one definition:
# arenaflow.evals.degeneracy;
# docs/lineages.md#000-two-repetition-measures)
LOOP_AT = degeneracy.LOOP_THRESHOLD
rep_ratio = degeneracy.rep_ratio


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
