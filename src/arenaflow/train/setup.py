"""A training's set-up: distributed start-up, the verified corpus and its data plan, the model,
the DeepSpeed engine (resumed where a checkpoint fits), and DPO's reference log-probs; the state
the loop then runs on (Run)."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arenaflow import engine, fused, jobclock, manifest, models
from arenaflow import schema as afschema
from arenaflow.train import build_lock, checkpoints, data, heldout, objective
from arenaflow.train import model as tmodel
from arenaflow.train.dist import deepspeed_config, ensure_dist_env, expandable_segments, zero_stage
from arenaflow.train.speed import cuda_warmup, grad_norm, lora_fused, lora_grouped, one_rank, rope

log = logging.getLogger("arenaflow.train")


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
    tracking: dict | None = None  # config `tracking:` as resolved (arenaflow.tracking)


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
    tokenizer = models.load_tokenizer(args.base_model, args.chat_template)
    r.net = tmodel.build(args.base_model, args.init, hyper, args.arm, tokenizer)
    jobclock.mark(args.out, "model")
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
    partial = models.partial_rotary(net)
    if partial:
        log.info("rotary embedding: the model's own code, as %s", partial)
    else:
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


SIDES = ("chosen", "rejected")  # a pairs corpus's rows; one forward pass takes both


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
