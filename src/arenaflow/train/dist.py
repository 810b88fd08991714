"""The distributed set-up of a training process: its rank's environment, the ZeRO stage and
DeepSpeed's config, the allocator's expandable segments."""

from __future__ import annotations

import os
import socket

import torch

from arenaflow import engine

# the ZeRO stage of a one-rank job under zero_stage: auto; why 2, not 0:
# docs/notes.md#one-rank-zero-stage-2-not-3
ONE_RANK_STAGE = 2


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
