"""training_evidence.json: what a finished run records of itself (its corpus and manifest,
base, init, hyperparameters and engine settings, world, wall time, memory, losses)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from arenaflow import engine, manifest
from arenaflow.train import data

if TYPE_CHECKING:
    from arenaflow.train.setup import Run


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
