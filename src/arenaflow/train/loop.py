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
import itertools
import json
import logging
import math
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arenaflow import engine, fused, io, jobclock, knobs, manifest, models
from arenaflow import schema as afschema
from arenaflow.train import build_lock, checkpoints, data, heldout, objective
from arenaflow.train import model as tmodel
from arenaflow.train.speed import cuda_warmup, grad_norm, lora_fused, lora_grouped, one_rank, rope

log = logging.getLogger("arenaflow.train")
# the ZeRO stage of a one-rank job under zero_stage: auto; why 2, not 0:
# docs/notes.md#one-rank-zero-stage-2-not-3
ONE_RANK_STAGE = 2
SIDES = ("chosen", "rejected")  # a pairs corpus's rows; one forward pass takes both


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now, for a rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_dist_env() -> None:
    """A plain `python -m` run is rank 0 of 1; without these DeepSpeed tries mpi4py."""
    if "RANK" in os.environ:
        return
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )


def zero_stage(hyper: dict, world: int) -> int:
    """The ZeRO stage a run of `world` ranks uses: the arm's `zero_stage`, 'auto' resolved.
    A one-rank ZeRO-3 job partitions nothing, yet its hooks around every module run each step:
    a host-bound SmolLM2-135M LoRA step on an H200 spent ~100 ms of 543 in them.
    Stage 2 takes the same optimizer steps (equal losses, BENCHMARKS.md) without them, and its
    checkpoints still resume on several ranks (train/checkpoints.py)."""
    setting = hyper["zero_stage"]
    if setting == "auto":
        return 3 if world > 1 else ONE_RANK_STAGE
    return int(setting)


def bf16(hyper: dict, cuda: bool) -> bool:
    """Whether DeepSpeed trains in bf16 (precision auto: on GPUs)."""
    return hyper["precision"] == "bf16" or (hyper["precision"] == "auto" and cuda)


def deepspeed_config(hyper: dict, cuda: bool, universal: bool, stage: int, world: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": hyper["micro_batch_size"],
        "gradient_accumulation_steps": hyper["grad_accum"],
        "gradient_clipping": hyper["max_grad_norm"],
        # Parameters smaller than this stay gathered on every rank. Tests set 0 so that every
        # parameter is partitioned, however small (a tiny model otherwise hides save bugs).
        "zero_optimization": {
            "stage": stage,
            "stage3_param_persistence_threshold": hyper["zero3_persistence_threshold"],
            # Below stage 3, DeepSpeed copies each gradient into a contiguous reduce bucket as
            # backward makes it, against fragmentation while it reduces; one rank reduces
            # nothing, and the copies were 420 of a SmolLM2 LoRA step's launches (BENCHMARKS.md)
            "contiguous_gradients": world > 1,
        },
        "zero_allow_untested_optimizer": True,
        # DeepSpeed's bf16 overflow check runs ~13 kernels per gradient tensor every step (420
        # LoRA tensors on SmolLM2: ~5.5k of a host-bound step's ~9.9k launches) to skip steps
        # that overflow, a loss-scaling concern bf16 does not have; check_finite() stops the run
        # instead (docs/notes.md#bf16-no-overflow-check-a-diverged-run-stops).
        "bf16": {
            "enabled": bf16(hyper, cuda),
            "check_grad_overflow": engine.get("bf16_overflow_check"),
        },
        "steps_per_print": 10**9,
        "checkpoint": {"load_universal": universal},
    }


def start_profile(step: int):
    """A running torch.profiler when knobs.PROFILE_STEP names this step, else None (its table
    goes to runs/{arm}/profile_rank0.txt)."""
    if knobs.get(knobs.PROFILE_STEP) != str(step):
        return None
    from torch.profiler import ProfilerActivity, profile

    prof = profile(
        activities=[ProfilerActivity.CPU]
        + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    )
    prof.start()
    return prof


def finish_profile(prof, path: Path) -> None:
    """Stop the profiler and write its tables: device time first, then host time."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.stop()
    path.parent.mkdir(parents=True, exist_ok=True)
    by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table = prof.key_averages()
    path.write_text(
        table.table(sort_by=by, row_limit=40)
        + "\n"
        + table.table(sort_by="self_cpu_time_total", row_limit=25)
    )


class Progress:
    """What someone watching a run sees: every step appended to runs/{arm}/metrics.jsonl and
    flushed (so `tail -f` follows a running job; final/ gets the whole list only at the end),
    and a log line every 10 steps with tokens/s and the ETA. Rates count this process only: a
    resumed run's earlier steps ran elsewhere, at another speed."""

    def __init__(self, path: Path, resumed: list[dict], start: int, n_steps: int, rank: int):
        self.start, self.n_steps, self.rank = start, n_steps, rank
        self.t0, self.tokens0 = time.time(), resumed[-1]["tokens_seen"] if resumed else 0
        self.file = None
        if (
            rank == 0
        ):  # rewritten from the checkpoint's steps, so a resumed step is not listed twice
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = path.open("w", encoding="utf-8")
            for m in resumed:
                self.write(m)

    def write(self, m: dict) -> None:
        self.file.write(json.dumps(m, sort_keys=True) + "\n")
        self.file.flush()

    def step(self, m: dict, lrs: dict) -> None:
        if self.rank != 0:
            return
        self.write(m)
        step = m["step"]
        if step % 10 and step not in (1, self.start + 1, self.n_steps):
            return
        took = max(time.time() - self.t0, 1e-9)
        eta = took / (step - self.start) * (self.n_steps - step)
        log.info(
            "step %d/%d | loss %.5f | grad_norm %.4f | lr %s | tok %d | %.0f tok/s | %.1fs "
            "| ETA %.0fs",
            step,
            self.n_steps,
            m["loss"],
            m["grad_norm"] or 0.0,
            {k: f"{v:.2e}" for k, v in lrs.items()},
            m["tokens_seen"],
            (m["tokens_seen"] - self.tokens0) / took,
            m["elapsed_s"],
            eta,
        )

    def close(self) -> None:
        if self.file:
            self.file.close()


def reference_logprobs(r: Run) -> dict:
    """DPO's reference: the init policy's log-probs of every chosen/rejected response, computed
    once before the first update by the engine itself, in the first epoch's micro-batches: the
    same dtype, kernels and batch shapes as the policy's first step, whose log-ratios are then
    exactly 0. (A float32 reference under bf16 training left a mean first-step margin of
    -0.0062 on the tiny model at beta 0.5, and 47 % of lineage 002's pairs "preferred" before
    any update on the H200.) In eval mode: no dropout in the reference."""
    n = len(r.corpus["chosen"])
    ref = {side: torch.zeros(n) for side in SIDES}  # on the host: the loop moves each share
    epoch = data.steps_per_epoch(n, r.hyper, r.world)
    r.engine.eval()
    with torch.no_grad():
        for _, glob in itertools.islice(data.global_batches(n, r.hyper, r.world), epoch):
            for rank in range(r.world):  # every rank's share on every rank: ZeRO-3 gathers in step
                for micro in data.micro_batches(glob, r.hyper, r.world, rank, r.lengths):
                    lp, _ = objective.pair_logprobs(r.engine, *pair_batch(r, micro)[1])
                    ref["chosen"][micro], ref["rejected"][micro] = lp.cpu().split(len(micro))
    r.engine.train()
    return ref


def pair_batch(r: Run, micro) -> tuple[dict, tuple[dict, dict]]:
    """A micro-batch of pairs: the host's collated sides, and (chosen, rejected) on the device."""
    cpu = {s: data.collate(r.corpus[s], micro, r.hyper["seq_len"], r.pad) for s in SIDES}
    dev = r.engine.device
    return cpu, tuple({k: v.to(dev) for k, v in cpu[s].items()} for s in SIDES)


@dataclass
class Run:
    """What setup() builds and the training, save and clean-up phases read and update."""

    args: Any
    hyper: dict
    cuda: bool
    rank: int
    world: int
    stage: int = 3  # the ZeRO stage (zero_stage, resolved)
    corpus: dict = None
    corpus_record: dict = None
    sources: list | None = None  # a mixture's per-source statistics
    preference: bool = False
    heldout: list | None = None  # rows held out of training (heldout_rows), and their indices
    heldout_idx: list | None = None
    net: Any = None
    pad: int = 0
    rows: list = None
    ref: dict | None = None
    n_steps: int = 0
    lengths: Any = None
    warmup: int = 0  # learning-rate warm-up steps
    cuda_warmup: Any = None  # the thread of cuda_warmup.start
    base_rev: str = ""
    out: Path = None
    ckpt_dir: Path = None
    run_id: Any = None
    plan: Any = None
    engine: Any = None
    optimizer: Any = None
    adapter_plan: list | None = None  # the final save's tensors (train/model.adapter_plan)
    start: int = 0
    metrics: list = field(default_factory=list)
    tokens_seen: int = 0
    t0: float = 0.0
    wall: float = 0.0


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
    with engine.job(args.engine_json):
        r = setup(args, hyper)
        train(r)
        save(r)
        cleanup(r)


def expandable_segments() -> None:
    """Length-bucketed micro-batches change shape every step, and the caching allocator's fixed
    segments fragment: on the H200 two SmolLM2 trainings side by side (run 21 of BENCHMARKS.md)
    held 86 GiB for a 55.6 GiB peak, and the other ran out of memory. So segments grow in place,
    unless the user configured the allocator. Set at run time, before the first allocation: an
    allocator variable set once torch is loaded (the fork server loads it) may be read too late
    (pytorch/pytorch#104801). Since torch 2.9 the cuda setter only forwards, with a FutureWarning,
    to the accelerator-wide one: that one is called where it exists."""
    if not (os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")):
        set_settings = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
        (set_settings or torch.cuda.memory._set_allocator_settings)("expandable_segments:True")


def setup(args, hyper: dict) -> Run:
    """Distributed start-up, logging, corpus, model and DeepSpeed engine, resumed if a checkpoint
    fits."""
    import deepspeed

    jobclock.mark(args.out, "imports")
    ensure_dist_env()
    cuda = torch.cuda.is_available()
    if cuda:
        expandable_segments()
    with contextlib.nullcontext() if cuda else build_lock.watched():  # CPU: DeepSpeed's shm op
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    jobclock.mark(args.out, "distributed")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    log.info("arm %s: %s", args.arm, json.dumps(hyper, sort_keys=True))
    log.info("code: %s", json.dumps(manifest.code_version()))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        tmodel.attention_kernels()
    # marked apart: a fresh process on the H200 spends ~11 s (median) here, in the warm-up's
    # launch on this thread (it imports deepspeed.runtime.utils and the model class), against
    # 0.0 s under the fork server, which made those imports before forking (BENCHMARKS.md, run 18)
    jobclock.mark(args.out, "device")
    r = Run(args=args, hyper=hyper, cuda=cuda, rank=rank, world=world)
    load_data(r)
    jobclock.mark(args.out, "corpus")
    # beside the model load, at the shape of the job's largest micro-batch
    shape = data.largest_micro_batch(r.corpus, hyper, world)
    r.cuda_warmup = cuda_warmup.start(args.base_model, shape, cuda_warmup.job_lora(hyper))
    jobclock.mark(args.out, "warm-up")
    r.stage = zero_stage(hyper, world)
    log.info("ZeRO stage %d (zero_stage: %s, %d ranks)", r.stage, hyper["zero_stage"], world)
    setup_data(r)
    setup_engine(r)
    return r


def load_data(r: Run) -> None:
    """The corpus, or a mixture of several (arm `corpus: {id: count | all}`): its rows, a record
    with its digest and files, and per source the rows, tokens and supervised fraction taken."""
    args = r.args
    if args.mix_json is None:
        if len(args.corpus) != 1:
            raise SystemExit(f"{len(args.corpus)} corpora given without --mix-json")
        r.corpus, r.corpus_record = data.load_corpus(Path(args.corpus[0]))
        return
    mix = json.loads(args.mix_json)
    r.corpus, r.corpus_record, r.sources = data.load_mixture(
        [Path(c) for c in args.corpus], mix, r.hyper["seed"], args.arm_file
    )
    for s in r.sources:
        log.info(
            "mixture source %s: %d of %d rows, %d tokens, supervised fraction %.3f",
            s["corpus"],
            s["rows"],
            s["rows_available"],
            s["tokens"],
            s["supervised_fraction"],
        )


def setup_data(r: Run) -> None:
    """Model, tokenizer, step count and the checkpoint plan, for the loaded corpus."""
    args, hyper = r.args, r.hyper
    corpus = r.corpus
    r.preference = preference = hyper["objective"] in afschema.PREFERENCE_OBJECTIVES
    if preference != ("chosen" in corpus):
        raise SystemExit(
            f"objective {hyper['objective']!r} needs a "
            f"{'pairs' if preference else 'sft'} corpus; {args.corpus} is not one"
        )
    torch.manual_seed(hyper["seed"])
    r.net = tmodel.build(args.base_model, args.init, hyper)
    jobclock.mark(args.out, "model")
    tokenizer = models.load_tokenizer(args.base_model)
    r.pad = models.pad_id(tokenizer)
    rows = corpus["chosen"] if preference else corpus["sft"]
    if hyper["heldout_rows"]:
        if preference:
            raise SystemExit(f"heldout_rows needs an sft objective, not {hyper['objective']!r}")
        rows, r.heldout, r.heldout_idx = heldout.split(rows, hyper["heldout_rows"], hyper["seed"])
        corpus["sft"] = rows
    if hyper["packing"] and not preference:
        rows = corpus["sft"] = data.pack(rows, hyper["seq_len"])
    r.rows = rows
    r.n_steps = data.total_steps(len(rows), hyper, r.world)
    if hyper["length_bucketing"]:
        r.lengths = data.row_lengths(rows, hyper["seq_len"])
        if preference:
            r.lengths = np.maximum(
                r.lengths, data.row_lengths(corpus["rejected"], hyper["seq_len"])
            )
    r.warmup = math.ceil(hyper["warmup_ratio"] * r.n_steps)
    if r.rank == 0 and (note := warmup_note(r.n_steps, r.warmup)):
        log.warning("arm %s: %s", args.arm, note)
    r.base_rev = models.base_revision(args.base_model, args.base_revision)
    r.out = Path(args.out)
    r.ckpt_dir = r.out.parent / "checkpoints"
    r.run_id = checkpoints.identity(
        hyper, r.corpus_record["digest"], args.init, r.base_rev, r.world
    )
    r.plan = checkpoints.plan(r.ckpt_dir, r.run_id, r.world, r.stage)
    if r.plan.universal:
        checkpoints.to_universal(r.ckpt_dir, r.plan, r.world, r.stage)


def warmup_note(n_steps: int, warmup: int) -> str | None:
    """What a run whose steps are all in the learning-rate warm-up should be told. The schedule
    (transformers', as HF's Trainer) takes its first step at LR 0, so a run of one step leaves
    its weights where they started."""
    if not warmup or n_steps > warmup:
        return None
    if n_steps == 1:
        return (
            "its one optimizer step is the warm-up's first, taken at LR 0: the weights will not "
            "change (more rows, a smaller micro-batch or warmup_ratio 0 give it a step that does)"
        )
    return f"all {n_steps} optimizer steps fall in the LR warm-up ({warmup} steps)"


def setup_engine(r: Run) -> None:
    """ZeRO-3 leaves, fused kernels, the DeepSpeed engine, DPO's reference and the resumed
    steps."""
    import deepspeed
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    net, hyper = r.net, r.hyper
    leaf = []
    if r.stage == 3:  # below stage 3 no weight is partitioned, nothing hooks modules
        leaf = tmodel.mark_zero3_leaves(net, hyper, r.args.base_model)
        log.info("ZeRO-3 leaf modules: %s", leaf or "none (hooks on every submodule)")
    # The fused function reads the weights directly: whole blocks gathered, or none partitioned
    if (leaf or r.stage < 3) and hyper["method"] == "lora" and hyper["fused_lora"]:
        log.info("fused LoRA linears: %d", lora_fused.fuse(net))
        if hyper["grouped_lora"]:
            log.info("grouped LoRA linears (q/k/v, gate/up): %d", lora_grouped.group(net))
    backend = {"auto": None}.get(engine.get("fused_backend"), engine.get("fused_backend"))
    setting = hyper["fused_kernels"]
    if (r.cuda or backend) and fused.wanted(setting, r.n_steps):  # inductor: gains seen on GPUs
        n = fused.install(net, backend or "inductor")
        log.info("fused norm and SwiGLU kernels: %d modules", n)
    elif setting == "auto":  # too few steps to pay a compile back, or no GPU: nothing compiled
        n = fused.install_native_norms(net)
        log.info("norms through torch.rms_norm: %d (fused_kernels auto, %d steps)", n, r.n_steps)
    else:
        log.info("fused norm and SwiGLU kernels: off (fused_kernels %s)", setting)
    warmed = cuda_warmup.finish(r.cuda_warmup)  # before DeepSpeed: nothing runs beside it
    # after the warm-up's thread: the function is a module global it calls too
    log.info("rotary embedding as one autograd node: %d modeling modules", rope.install(net))
    r.adapter_plan = tmodel.adapter_plan(net)  # once, here: the final save walks nothing
    if r.adapter_plan is not None:
        log.info("adapter save: %d tensors, matched to their parameters", len(r.adapter_plan))
    jobclock.mark(r.args.out, "setup")  # data plan, leaves, fused kernels
    r.engine, r.optimizer, _, _ = deepspeed.initialize(
        model=net,
        optimizer=tmodel.optimizer(net, hyper, fused=r.cuda or None),
        # A callable, so the schedule wraps DeepSpeed's optimizer; DeepSpeed's own
        # WarmupCosineLR runs one step behind
        # (docs/notes.md#separate-learning-rates-and-the-scheduler).
        lr_scheduler=lambda opt: get_cosine_with_min_lr_schedule_with_warmup(
            opt, r.warmup, r.n_steps, min_lr_rate=hyper["min_lr_ratio"]
        ),
        config=deepspeed_config(hyper, r.cuda, r.plan.universal, r.stage, r.world),
    )
    cuda_warmup.refill(warmed)  # DeepSpeed emptied the CUDA cache the warm-up had grown
    if grad_norm.install(r.engine.optimizer):
        log.info("ZeRO-%d gradient norm: multi-tensor kernels", r.stage)
    if one_rank.install(r.engine.optimizer):
        log.info("ZeRO-%d on one rank: the identity all-reduce skipped", r.stage)
    if hyper["objective"] == "dpo":  # from the init weights: before a checkpoint replaces them
        r.ref = reference_logprobs(r)
        jobclock.mark(r.args.out, "reference")
    r.start, r.metrics = checkpoints.resume(r.engine, r.ckpt_dir, r.plan)
    if r.rank == 0:  # start-up (imports, model, DeepSpeed) ends; the first step compiles
        jobclock.loaded(r.args.out)
    r.tokens_seen = r.metrics[-1]["tokens_seen"] if r.metrics else 0
    r.t0 = time.time() - (r.metrics[-1]["elapsed_s"] if r.metrics else 0.0)


def train(r: Run) -> None:
    """Every step after the resumed ones: metrics appended, checkpoints every `checkpoint_every`."""
    progress = Progress(r.out.parent / "metrics.jsonl", r.metrics, r.start, r.n_steps, r.rank)
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
            manifest.write(tmp, params=r.hyper)
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


def corpus_evidence(r: Run) -> dict:
    """The corpus's manifest sha256; a mixture's sources instead (each with its manifest's)."""
    if r.sources is None:
        return {"manifest_sha256": manifest.sha256_file(Path(r.args.corpus[0]) / manifest.MANIFEST)}
    return {"mixture": r.sources, "mixture_seed": r.hyper["seed"]}


def training_evidence(r: Run) -> dict:
    args, cuda, wall, metrics = r.args, r.cuda, r.wall, r.metrics
    return {
        "arm": args.arm,
        "job_id": os.environ.get("SLURM_JOB_ID") or f"local-{socket.gethostname()}-{os.getpid()}",
        "gpu_env": {
            k: os.environ.get(k)
            for k in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES")
        },
        "optimizer_steps": len(metrics),
        "resumed_from_step": r.start or None,
        "tokens_seen": r.tokens_seen,
        "dataset_sha256": r.corpus_record["digest"],
        "dataset_files_sha256": {k: v["sha256"] for k, v in r.corpus_record["files"].items()},
        "corpus": args.corpus_id or Path(args.corpus[0]).name,
        **corpus_evidence(r),
        "base_model": args.base_name or args.base_model,
        "base_revision": r.base_rev,
        "init": Path(args.init).parent.name if args.init != "base" else "base",
        "hyperparameters": r.hyper,
        "engine": engine.settings(),
        "world_size": r.world,
        "zero_stage": r.stage,
        "device": "cuda" if cuda else "cpu",
        "code": manifest.code_version(),
        "wall_time_s": round(wall, 2),
        "gpu_hours": round(wall * r.world / 3600, 4) if cuda else 0.0,
        "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        # what the process held from the device: the peak plus the cache's fragmentation
        "peak_gpu_reserved_gib": (
            round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None
        ),
        "final_loss": metrics[-1]["loss"] if metrics else None,
        **heldout_evidence(r),
    }


def heldout_evidence(r: Run) -> dict:
    """The held-out rows (indices in the corpus, or a mixture's concatenated rows) and their loss
    at every evaluation; the last is after the final step, on the final weights."""
    if not r.heldout:
        return {}
    curve = [
        {"step": m["step"], "loss": m["heldout_loss"]} for m in r.metrics if "heldout_loss" in m
    ]
    return {
        "heldout": {
            "rows": len(r.heldout),
            "row_indices": [int(i) for i in r.heldout_idx],
            "supervised_tokens": data.supervised_tokens(
                r.heldout, range(len(r.heldout)), r.hyper["seq_len"]
            ),
            "every": r.hyper["heldout_every"],
            "curve": curve,
            "final_loss": curve[-1]["loss"] if curve else None,
        }
    }


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
