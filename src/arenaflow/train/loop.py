"""The training loop: DeepSpeed ZeRO (CPU/gloo here, CUDA/NCCL on GPUs), resumable.

ZeRO stage 3 on several ranks; on one rank (`zero_stage: auto`) stage 2, since one rank has
nothing to partition and ZeRO-3's per-module hooks only cost host time (zero_stage()).

Checkpoints go to runs/{arm}/checkpoints/step_NNNNNN every `checkpoint_every` optimizer steps,
tagged with a fingerprint of everything that defines the run (train/checkpoints.py). A retried
job resumes from the latest checkpoint with the same fingerprint, also at another world size,
and, since global batches are a pure function of (seed, step), ends with the same weights as an
uninterrupted run; a checkpoint with another fingerprint is discarded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from arenaflow import engine, io, jobclock, knobs, manifest, tracking
from arenaflow import schema as afschema
from arenaflow.train import checkpoints, data, heldout, objective
from arenaflow.train import model as tmodel
from arenaflow.train.evidence import corpus_evidence, training_evidence
from arenaflow.train.progress import Progress, finish_profile, start_profile
from arenaflow.train.setup import SIDES, Run, pair_batch, setup

log = logging.getLogger("arenaflow.train")


def run(args) -> None:
    """Setup, train, save, clean up (the phases of a torchtune recipe)."""
    hyper = json.loads(args.params_json)  # whole as resolved (arenaflow.config), but RUN_KEYS
    defaults = afschema.hyper_defaults()
    missing = sorted(set(defaults) - set(hyper) - set(afschema.RUN_KEYS))
    if missing:  # a run by hand with a partial hyper: arm.schema.yaml's defaults for the rest
        log.warning("hyperparameters not given, the schema's defaults used: %s", missing)
    # the scheduler's keys reach the job as resources (checkpoint_every below), not as params
    filled = [*missing, *afschema.RUN_KEYS]
    hyper = {**{k: defaults[k] for k in filled if k in defaults}, **hyper}
    if args.checkpoint_every is not None:
        hyper["checkpoint_every"] = args.checkpoint_every
    settings = tracking.from_json(args.tracking_json)
    if settings:  # at the job's start, not in its first step
        tracking.require(settings["backends"], f"arm {args.arm}: --tracking-json")
    with engine.job(args.engine_json):
        r = setup(args, hyper)
        r.tracking = settings
        train(r)
        save(r)
        cleanup(r)


def train(r: Run) -> None:
    """Every step after the resumed ones: metrics appended, checkpoints every `checkpoint_every`."""
    tracker = open_tracker(r) if r.rank == 0 else None
    progress = Progress(
        r.out.parent / "metrics.jsonl", r.metrics, r.start, r.n_steps, r.rank, tracker
    )
    for step, glob in data.global_batches(len(r.rows), r.hyper, r.world):
        if step > r.n_steps:
            break
        if step <= r.start:
            continue
        m, lrs = train_step(r, step, glob)
        if r.heldout and heldout.due(step, r.n_steps, r.hyper["heldout_every"]):
            m["heldout_loss"] = heldout.evaluate(
                r.engine, r.heldout, r.hyper, r.pad, r.world, r.rank
            )["loss"]
        r.metrics.append(m)
        progress.step(m, lrs)
        if (
            r.hyper["checkpoint_every"]
            and step % r.hyper["checkpoint_every"] == 0
            and step < r.n_steps
        ):
            save_checkpoint(r, step)
    r.wall = time.time() - r.t0
    progress.close()
    if r.rank == 0:  # the steps' end: what follows (the save) is reported apart
        jobclock.event(r.args.out, "trained")


def open_tracker(r: Run) -> tracking.Run:
    """The arm's run in the trackers, <lineage>/<arm>: its resolved hyperparameters as
    parameters, its corpus, init and digests as tags."""
    tags = {
        "arm": r.args.arm,
        "corpus": r.args.corpus_id or Path(r.args.corpus[0]).name,
        "dataset_sha256": r.corpus_record["digest"],
        **corpus_evidence(r),
        "init": Path(r.args.init).parent.name if r.args.init != "base" else "base",
        "world_size": r.world,
    }
    if "mixture" in tags:  # the sources' ids and digests, as one tag
        tags["mixture"] = json.dumps(tags["mixture"], sort_keys=True)
    return tracking.open_run(
        r.tracking, r.args.arm, kind="train", params={**r.hyper, **tags}, tags=tags
    )


def train_step(r: Run, step: int, glob) -> tuple[dict, dict]:
    """One optimizer step over the global batch `glob`: its metrics and the LRs it applied."""
    prof = start_profile(step)
    # Divide each micro-batch's *sum* by the global count; DeepSpeed divides by grad_accum
    # and averages over ranks, hence the world * accum factor.
    n_global = (
        len(glob) if r.preference else data.supervised_tokens(r.rows, glob, r.hyper["seq_len"])
    )
    scale = r.world * r.hyper["grad_accum"] / max(n_global, 1)
    sums, lrs, shapes = accumulate(r, glob, scale)
    if prof:
        finish_profile(prof, r.out.parent / f"profile_rank{r.rank}.txt")
    r.tokens_seen += int(sums[1])
    gn = r.engine.get_global_grad_norm()
    m = {
        "step": step,
        "loss": float(sums[0]) / max(n_global, 1),
        "grad_norm": None if gn is None else float(gn),
        "lr": lrs,
        "tokens_seen": r.tokens_seen,
        "elapsed_s": round(time.time() - r.t0, 3),
        # this rank's forward passes, padded: what a step costs, and what a bench can replay
        "micro_batches": shapes,
    }
    if r.preference:
        m.update(margin=float(sums[2]) / len(glob), pref_acc=float(sums[3]) / len(glob))
    check_finite(m, r.args.arm, glob)
    return m, lrs


def check_finite(m: dict, arm: str, glob) -> None:
    """Stop a run whose loss or gradient norm is not finite (DeepSpeed reports a NaN or infinite
    norm as -1), naming the step and its rows: a diverged run must not reach a bundle, and
    skipping the step (DeepSpeed's fp16 answer) would hide it."""
    gn = m["grad_norm"]
    if math.isfinite(m["loss"]) and (gn is None or (math.isfinite(gn) and gn >= 0)):
        return
    rows = sorted(int(i) for i in glob)
    raise FloatingPointError(
        f"arm {arm}: step {m['step']} has loss {m['loss']} and gradient norm {gn} (a NaN or "
        f"infinite norm reads -1): training diverged. The step's training rows (indices after "
        f"the held-out split and packing): {rows[:8]}{' ...' if len(rows) > 8 else ''} "
        f"({len(rows)} rows). Lower lr, or look for a broken row."
    )


def accumulate(r: Run, glob, scale: float) -> tuple[torch.Tensor, dict, list]:
    """Forward and backward of this rank's micro-batches; [loss, tokens, margin, pref_acc]
    summed over ranks (on the host), the LRs applied and each forward's [rows, width]."""
    engine = r.engine
    # Summed on the device and read once per step: a .item() per micro-batch would stall
    # the host until the GPU drains, every micro-batch.
    loss_acc = torch.zeros((), dtype=torch.float64, device=engine.device)
    host = [0.0, 0.0, 0.0]  # tokens, margin, pref_acc
    shapes = []
    for micro in data.micro_batches(glob, r.hyper, r.world, r.rank, r.lengths):
        loss_sum, diag, ntok, shape = micro_loss(r, micro)
        shapes.append(shape)
        engine.backward(loss_sum * scale)
        lrs = {g["name"]: g["lr"] for g in r.optimizer.param_groups}  # the LRs this step applies
        engine.step()
        loss_acc += loss_sum.detach()
        host = [
            host[0] + ntok,
            host[1] + diag.get("margin", 0.0),
            host[2] + diag.get("pref_acc", 0.0),
        ]
    sums = torch.cat(
        [loss_acc.reshape(1), torch.tensor(host, dtype=torch.float64, device=engine.device)]
    )
    if r.world > 1:
        torch.distributed.all_reduce(sums)  # on the device: NCCL reduces CUDA tensors only
    return sums.cpu(), lrs, shapes


def micro_loss(r: Run, micro) -> tuple[torch.Tensor, dict, int, list[int]]:
    """One micro-batch's summed loss, its diagnostics, its attended tokens and the [rows, width]
    its forward pass ran at (a pair's sides stacked, objective.stack_sides)."""
    engine, seq_len, pad = r.engine, r.hyper["seq_len"], r.pad
    if r.preference:
        cpu, sides = pair_batch(r, micro)
        ref = tuple(r.ref[s][micro].to(engine.device) for s in SIDES) if r.ref else None
        loss_sum, diag = objective.preference_sum(engine, *sides, ref, r.hyper)
        ntok = int(cpu["chosen"]["attention_mask"].sum() + cpu["rejected"]["attention_mask"].sum())
        shape = [2 * len(micro), max(cpu[s]["input_ids"].shape[1] for s in SIDES)]
    else:
        cpu = data.collate(r.rows, micro, seq_len, pad)
        batch = {k: v.to(engine.device, non_blocking=True) for k, v in cpu.items()}
        loss_sum, diag = objective.sft_sum(engine, batch)
        ntok = int(cpu["attention_mask"].sum())
        shape = list(cpu["input_ids"].shape)
    return loss_sum, diag, ntok, shape


def save_checkpoint(r: Run, step: int) -> None:
    checkpoints.save(r.engine, r.ckpt_dir, step, r.metrics, r.run_id, r.world, r.stage)
    if knobs.get(knobs.FAIL_AFTER_STEP) == str(step):  # fault injection, after the checkpoint
        log.warning("%s=%d: exiting as if preempted", knobs.FAIL_AFTER_STEP, step)
        sys.stdout.flush()
        os._exit(75)


def save(r: Run) -> None:
    """The final weights, evidence, metrics and manifest; the probe's logits when asked."""
    # Every rank joins the gather inside save(); only rank 0 writes.
    with io.atomic_dir(r.out) if r.rank == 0 else contextlib.nullcontext(r.out) as tmp:
        tmodel.save(r.engine, r.net, tmp, r.rank, r.hyper, r.stage, r.adapter_plan)
        if r.rank == 0:  # the save's parts, for BENCHMARKS.md: the GPU idles through them
            jobclock.event(r.args.out, "weights_saved")
            io.write_json(tmp / "training_evidence.json", training_evidence(r))
            io.write_jsonl(tmp / "metrics.jsonl", r.metrics)
            manifest.write(tmp, params=r.hyper, written_as=r.out)
    if r.rank == 0:
        jobclock.event(r.args.out, "committed")
    if knobs.get(knobs.PROBE_LOGITS):  # tests: the trained engine's logits on row 0
        # Every rank joins the forward (ZeRO-3 gathers each layer's shards as it runs).
        probe = {
            k: v.to(r.engine.device)
            for k, v in data.collate(r.rows, [0], r.hyper["seq_len"], r.pad).items()
        }
        with torch.no_grad():
            logits = r.engine(
                input_ids=probe["input_ids"], attention_mask=probe["attention_mask"]
            ).logits
        if r.rank == 0:
            torch.save(
                {"input_ids": probe["input_ids"].cpu(), "logits": logits.float().cpu()},
                knobs.get(knobs.PROBE_LOGITS),
            )


def cleanup(r: Run) -> None:
    """Drop the checkpoints, log the summary and leave the process group together."""
    if r.rank == 0:
        shutil.rmtree(r.ckpt_dir, ignore_errors=True)  # the final weights supersede them
        log.info(
            "arm %s: %d steps, final loss %.4f, %.1fs -> %s",
            r.args.arm,
            len(r.metrics),
            r.metrics[-1]["loss"],
            r.wall,
            r.out,
        )
        jobclock.done(r.args.out, tokens=r.tokens_seen, seconds=round(r.wall, 3))
    # No rank leaves before rank 0 has committed the outputs (see __main__ on the exit itself).
    # One rank waits for nobody; DeepSpeed binds no device for a single-rank group, so NCCL's
    # barrier would warn that it guesses one (12 times in lineage 002's logs)
    if r.world > 1:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()
