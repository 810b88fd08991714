"""On-policy candidates: k samples per prompt from a policy, then a verdict for every sample.

    python -m arenaflow.candidates sample --pool pools/P.jsonl --base-model DIR
        [--adapter runs/A/final] --system-prompt S
        --params-json '{"k": 4, "temperature": 0.8, ...}' --out candidates/C/samples.jsonl
    python -m arenaflow.candidates verify --pool pools/P.jsonl --samples candidates/C/samples.jsonl
        [--marker FINAL:] --out candidates/C/verdicts.jsonl

A verdict records length, whether the sample stopped on a stop token and the degeneracy flags
(empty, loop = rep_ratio(6) >= 0.25, low n-gram uniqueness, truncated, U+FFFD), plus, by pool kind:
math, arenaflow.verify.check's extracted answer and verdicts; instruction following, the constraint
checker's verdict and a reason per failed check. `correct` (what rejection sampling keeps): math,
verify.check's `correct`; instruction following, every check passes and no loop; open-ended, no
loop, no low uniqueness and at least the row's min_chars; and for all, stopped, non-empty, free of
U+FFFD.

Scaffolded generation (a corpus's `scaffold: {system, marker}`, lineage 003's lensyn stage:
docs/lineages.md#003-scaffolded-generation): the policy samples under the scaffold's system
message (draft, count, revise, then the answer after the marker), and a verdict judges only the
final answer, the text after the last marker (stripped), which it records as `final`; a sample
without the marker, or with nothing after it, is rejected with that reason. The corpus trains on
`final` under the serving system prompt (arenaflow.corpora.build), never on the draft.

Sampling keeps each finished batch beside its output (arenaflow.decode.parts): a job killed part
way through and run again decodes only the batches it lacks, into the same samples file.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from arenaflow import chat, engine, io, jobclock, manifest, paths, tracking, verify
from arenaflow import schema as afschema
from arenaflow.evals import degeneracy
from arenaflow.instruct import check as ifcheck
from arenaflow.pools.validate import no_template_markers, read_pool

# torch, transformers and the decode loop (seconds of imports) are imported where a sample is
# drawn, so that verifying, a CPU job, does without them.


def full_params(params: dict) -> dict:
    """A corpus's sampling params with the schema's defaults for the keys they lack."""
    return {**afschema.schema_defaults("corpus"), **params}


def sample(
    pool: list[dict],
    model,
    tokenizer,
    system_prompt: str,
    params: dict,
    job=None,
    first_batch: int = 0,
) -> list[dict]:
    """k samples per prompt, decoded as the corpus's sampling params say (schema.sampling_params;
    a key they lack is the schema's default), by this process's engine settings' decoder. With
    `job` (an arenaflow.decode.parts.Job), finished batches are kept and a rerun resumes. A
    shard's `pool` is its prompts and `first_batch` the index of their first batch in the whole
    pool (arenaflow.shards)."""
    from arenaflow.decode import sampling

    params = full_params(params)
    if params.get("scaffold"):  # sampled under the scaffold; trained under the serving prompt
        system_prompt = params["scaffold"]["system"]
    fmt = chat.format_of(tokenizer)
    prompts = [chat.render(chat.row_messages(system_prompt, r), True, fmt) for r in pool]
    dec = sampling.Decoding(
        temperature=params["temperature"],
        top_p=params["top_p"],
        max_new_tokens=params["max_new_tokens"],
    )
    outs = sampling.generate(
        model,
        tokenizer,
        prompts,
        dec,
        k=params["k"],
        seed=params["seed"],
        batch_size=params["batch_size"],
        desc="sample",
        engine=engine.get("decoder"),
        job=job,
        first_batch=first_batch,
    )
    rows = []
    for r, samples in zip(pool, outs):
        for j, s in enumerate(samples):
            rows.append({"id": f"{r['id']}#{j}", "prompt_id": r["id"], "sample": j, **s})
    return rows


def final_answer(text: str, marker: str) -> str | None:
    """The scaffold's final answer: the text after the last `marker`, stripped; None without
    one."""
    at = text.rfind(marker)
    return None if at < 0 else text[at + len(marker) :].strip()


def _unscaffolded(sample_row: dict, reason: str) -> dict:
    """The verdict of a scaffolded sample with no final answer: rejected, with the reason."""
    return {
        "id": sample_row["id"],
        "prompt_id": sample_row["prompt_id"],
        "sample": sample_row["sample"],
        "chars": 0,
        "n_tokens": sample_row["n_tokens"],
        "stopped": sample_row["stopped"],
        **degeneracy.flags("", sample_row["stopped"]),
        "final": None,
        "passed": False,
        "reasons": [reason],
        "correct": False,
    }


def verdict(sample_row: dict, pool_row: dict, marker: str | None = None) -> dict:
    """One sample's verdict, by what the pool row carries: `gold` (math), `constraints`
    (instruction following) or neither (open-ended, judged on form and length alone). With a
    scaffold `marker`, only the final answer after it is judged (and recorded as `final`)."""
    text = sample_row["text"]
    if marker is not None:
        text = final_answer(text, marker)
        if not text:
            what = (
                f"no {marker!r} marker" if text is None else f"nothing after the {marker!r} marker"
            )
            return _unscaffolded(sample_row, f"scaffold: {what}")
    flags = degeneracy.flags(text, sample_row["stopped"])
    clean = sample_row["stopped"] and not (flags["empty"] or flags["fffd"])
    out = {
        "id": sample_row["id"],
        "prompt_id": sample_row["prompt_id"],
        "sample": sample_row["sample"],
        "chars": len(text),
        "n_tokens": sample_row["n_tokens"],
        "stopped": sample_row["stopped"],
        **flags,
    }
    if "gold" in pool_row:
        v = verify.check(text, pool_row["gold"])
        out.update(v, correct=v["correct"] and clean)
    elif "constraints" in pool_row:
        c = ifcheck.check(text, pool_row["constraints"])
        out.update(
            passed=c["passed"],
            reasons=[x["reason"] for x in c["checks"] if not x["passed"]],
            correct=c["passed"] and clean and not flags["loop"],
        )
    else:
        long_enough = len(text) >= pool_row.get("min_chars", 0)
        out.update(correct=clean and long_enough and not (flags["loop"] or flags["low_unique"]))
    if marker is not None:
        out["final"] = text
    return out


def verify_all(
    pool: list[dict],
    samples: list[dict],
    samples_path: str,
    marker: str | None = None,
    workers: int = 1,
) -> list[dict]:
    """A verdict per sample, in order (with a scaffold `marker`, of the answer after it).
    `workers` > 1 spreads them over processes (math-verify's timeouts need each verdict in a
    main thread, which a worker process's task runs in)."""
    rows = {r["id"]: r for r in pool}
    for line, s in enumerate(samples, start=1):
        if s.get("prompt_id") not in rows:
            raise ValueError(
                f"{samples_path}:{line}: prompt_id {s.get('prompt_id')!r} is not in the pool"
            )
    pairs = [rows[s["prompt_id"]] for s in samples]
    markers = [marker] * len(samples)
    if workers <= 1 or len(samples) < 2 * workers:
        return list(map(verdict, samples, pairs, markers))
    with ProcessPoolExecutor(workers) as ex:
        chunk = -(-len(samples) // (4 * workers))
        return list(ex.map(verdict, samples, pairs, markers, chunksize=chunk))


def run_arm(run_dir: str | None) -> str:
    """The arm of a runs/{arm}/final directory; None: the base."""
    return Path(run_dir).parent.name if run_dir else "base"


def pass_at(verdicts: list[dict]) -> dict:
    """pass@1 (the mean share of a prompt's samples that are correct) and pass@k (the share of
    prompts with a correct sample among their k), over prompts."""
    by_prompt: dict = {}
    for v in verdicts:
        by_prompt.setdefault(v["prompt_id"], []).append(bool(v["correct"]))
    shares = [sum(c) / len(c) for c in by_prompt.values()]
    k = max((len(c) for c in by_prompt.values()), default=0)
    return {
        "verify/pass@1": sum(shares) / max(len(shares), 1),
        f"verify/pass@{k}": sum(s > 0 for s in shares) / max(len(shares), 1),
        "verify/prompts": len(shares),
    }


def shard_of_pool(pool: list[dict], params: dict, shard: str | None) -> tuple[list[dict], int]:
    """The prompts shard `shard` ('i-of-n'; None: the whole pool) samples and the index of their
    first batch (arenaflow.shards)."""
    from arenaflow import shards
    from arenaflow.decode.sampling import prompts_per_batch

    if shard is None:
        return pool, 0
    per_batch = prompts_per_batch(params["batch_size"], params["k"])
    s = shards.span(len(pool), per_batch, *shards.parse(shard))
    return pool[s.start : s.stop], s.first_batch


def write_samples(out: str, rows: list[dict], params: dict) -> None:
    io.write_jsonl(out, rows)
    manifest.write_file(out, params, rows=len(rows))


def _sample_cmd(args, pool: list[dict], params: dict) -> None:
    """Loads the policy, samples every prompt (of --shard's batches) k times, writes the
    samples. An empty shard writes an empty part without loading the model."""
    from arenaflow import models
    from arenaflow.decode import parts, sampling, vllm_engine
    from arenaflow.decode import warmup as decode_warmup

    pool, first_batch = shard_of_pool(pool, params, args.shard)
    decoder = engine.get("decoder")
    if not pool:
        write_samples(args.out, [], {**params, "decoded_by": {"decoder": decoder}})
        print(f"shard {args.shard}: no batches, an empty part -> {args.out}")
        return

    batch_rows = sampling.first_batch_rows(len(pool), params["k"], params["batch_size"])
    new_tokens = params["max_new_tokens"]
    warm = decode_warmup.start(args.base_model, batch_rows, new_tokens, engine.get("decoder"))
    load = vllm_engine.load_policy if engine.get("decoder") == "vllm" else models.load_policy
    model, tok = load(
        args.base_model,
        args.adapter,
        consumer="sampling",
        job=args.out,
        chat_template=args.chat_template,
    )
    no_template_markers(pool, args.pool, chat.markers(tok))
    decode_warmup.finish(warm, args.out)
    jobclock.loaded(args.out)  # start-up ends: the log line benchmarks/lineage_gpu.py reads
    t0 = time.perf_counter()
    job = parts.Job(args.out, parts.weights_of(args.base_model, args.adapter))
    rows = sample(pool, model, tok, args.system_prompt, params, job, first_batch)
    seconds = time.perf_counter() - t0
    template = chat.template_record(tok, args.chat_template)
    record = {**params, "chat_template": template}
    write_samples(args.out, rows, {**record, "decoded_by": vllm_engine.describe(decoder, model)})
    parts.finish(args.out)
    tokens = sum(r["n_tokens"] for r in rows)
    jobclock.done(args.out, tokens=tokens, seconds=seconds)
    # a shard's part is candidates/{corpus}/samples.shards/{shard}.jsonl
    where = Path(args.out).parent if args.shard is None else Path(args.out).parent.parent
    corpus, policy = where.name, run_arm(args.adapter)
    run = f"corpora/{corpus}/sample" + (f"/{args.shard}" if args.shard else "")
    tracking.summary(
        args.tracking,
        run,
        kind="sample",
        params=params,
        tags={"corpus": corpus, "policy": policy},
        metrics={0: {"sample/tokens_per_s": tokens / max(seconds, 1e-9), "sample/rows": len(rows)}},
    )
    print(f"{len(rows)} samples ({len(pool)} prompts x {params['k']}) -> {args.out}")


def merge_shards(parts: list[str], out: str) -> int:
    """Concatenate the sampling shards' parts, in order, into `out` with the manifest the
    unsharded job writes (the shards' params, the rows of all): the unsharded samples byte for
    byte. A part that fails its manifest, or was sampled with other params, raises ManifestError
    naming it. Returns the rows."""
    records = [manifest.require_file(p, "merging samples") for p in parts]
    for p, r in zip(parts, records):
        if _sampling(r["params"]) != _sampling(records[0]["params"]):
            raise manifest.ManifestError(
                f"merging samples refused {p}: sampled with other params than {parts[0]} "
                "(a part of an older run of the shards)"
            )
    with io.atomic_path(out) as tmp, open(tmp, "wb") as f:
        for p in parts:
            f.write(Path(p).read_bytes())
    rows = sum(r["rows"] for r in records)
    decoded = next((r for r in records if r["rows"]), records[0])  # an empty part loaded nothing
    manifest.write_file(out, decoded["params"], rows=rows)
    return rows


def _sampling(params: dict) -> dict:
    """A part's params but what only a part that loaded the policy can say: how its decoder
    served it and the chat template its tokenizer carried."""
    return {k: v for k, v in params.items() if k not in ("decoded_by", "chat_template")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample", help="k samples per prompt from a policy")
    s.add_argument("--pool", required=True, help="pools/{pool}.jsonl")
    s.add_argument("--base-model", required=True, help="base model directory")
    s.add_argument(
        "--adapter", default=None, help="the policy arm's runs/{arm}/final (omit for base)"
    )
    s.add_argument("--system-prompt", default="", help="system prompt for every prompt")
    s.add_argument(
        "--chat-template",
        default=None,
        help="base.chat_template: own, chatml or a .jinja file (default: the tokenizer's as saved)",
    )
    s.add_argument("--params-json", required=True, help="the corpus's config section as JSON")
    s.add_argument("--out", required=True, help="candidates/{corpus}/samples.jsonl")
    s.add_argument(
        "--shard",
        default=None,
        help="i-of-n: sample only shard i's batches of n (arenaflow.shards); --out is its part",
    )
    m = sub.add_parser("merge", help="the sampling shards' parts, concatenated in order")
    m.add_argument("--parts", nargs="+", required=True, help="the parts, shard 0 first")
    m.add_argument("--out", required=True, help="candidates/{corpus}/samples.jsonl")
    v = sub.add_parser("verify", help="a verdict for every sample")
    v.add_argument("--pool", required=True)
    v.add_argument("--samples", required=True)
    v.add_argument("--marker", default=None, help="scaffold marker: judge only the answer after it")
    v.add_argument("--out", required=True, help="candidates/{corpus}/verdicts.jsonl")
    v.add_argument(
        "--workers",
        type=int,
        default=min(8, len(os.sched_getaffinity(0))),
        help="processes verifying at once (default: the CPUs this job may use, at most 8; "
        "under Slurm, those it was allocated)",
    )
    for p in (s, v):
        p.add_argument(
            "--tracking-json",
            default=None,
            help="config `tracking:` as resolved, JSON (arenaflow.tracking; default: none)",
        )
    args = ap.parse_args(argv)
    if args.cmd == "merge":
        rows = merge_shards(args.parts, args.out)
        print(f"{rows} samples from {len(args.parts)} shards -> {args.out}")
        return
    args.tracking = tracking.from_json(args.tracking_json)
    pool = read_pool(args.pool)
    if args.cmd == "sample":
        params = full_params(json.loads(args.params_json))
        with engine.job(params.get("engine")):
            _sample_cmd(args, pool, params)
    else:
        samples = manifest.read_jsonl(args.samples, "verifying", paths.SAMPLES)
        rows = verify_all(pool, samples, args.samples, args.marker or None, args.workers)
        io.write_jsonl(args.out, rows)
        manifest.write_file(args.out, {"marker": args.marker or None}, rows=len(rows))
        corpus = Path(args.out).parent.name
        tracking.summary(
            args.tracking,
            f"corpora/{corpus}/verify",
            kind="verify",
            tags={"corpus": corpus},
            metrics={0: pass_at(rows)},
        )
        print(f"{sum(r['correct'] for r in rows)}/{len(rows)} samples correct -> {args.out}")


if __name__ == "__main__":
    main()
