"""Train one arm: LoRA on DeepSpeed ZeRO-3 (CPU/gloo here, CUDA/NCCL on GPUs).

    python -m arenaflow.train --arm B3 --params-json '{...}' --corpus corpora/rft_r3 \
        --init runs/R2d/final --base-model models/tiny-arith --out runs/B3/final
    torchrun --nproc_per_node 2 -m arenaflow.train ...        # N ranks, same command

An arm from `base` starts a fresh adapter; an arm from another arm continues that arm's adapter
as trainable, so every descendant carries its ancestors' updates. The corpus manifest is
verified before anything is loaded. Output (written atomically by rank 0): adapter_model.
safetensors + adapter_config.json, training_evidence.json, metrics.jsonl, manifest.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch

from arenaflow import io, manifest, models

log = logging.getLogger("arenaflow.train")


def ensure_dist_env() -> None:
    """A plain `python -m` run is rank 0 of 1; without these DeepSpeed tries mpi4py."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def load_corpus(corpus_dir: Path) -> tuple[list[tuple[np.ndarray, np.ndarray]], dict]:
    """Rows of (ids, mask) from a verified corpus; refuses one whose manifest does not verify."""
    record = manifest.verify(corpus_dir)
    data = np.load(corpus_dir / "sft.npz")
    ids, mask, off = data["input_ids"], data["loss_mask"], data["offsets"]
    rows = [(ids[a:b], mask[a:b]) for a, b in zip(off[:-1], off[1:])]
    return rows, record


def batches(n_rows: int, hyper: dict, world: int, rank: int, epochs: int):
    """Yield (step, micro index, row indices for this rank). Every rank sees the same seeded
    permutation; a global batch of up to micro*accum*world rows is split evenly across ranks
    round-robin, then into accum micro-batches (so a corpus smaller than one full global
    batch still trains, on smaller micro-batches)."""
    per_step = hyper["micro_batch_size"] * hyper["grad_accum"] * world
    if n_rows < hyper["grad_accum"] * world:
        raise SystemExit(f"corpus has {n_rows} rows, fewer than one per micro-batch "
                         f"(grad_accum {hyper['grad_accum']} x {world} ranks)")
    steps_per_epoch = max(1, n_rows // per_step)
    step = 0
    for epoch in range(epochs):
        order = np.random.default_rng(hyper["seed"] + epoch).permutation(n_rows)
        for s in range(steps_per_epoch):
            glob = order[s * per_step : (s + 1) * per_step]
            mine = glob[rank::world]
            step += 1
            for m, micro in enumerate(np.array_split(mine, hyper["grad_accum"])):
                yield step, m, micro


def total_steps(n_rows: int, hyper: dict, world: int) -> int:
    per_step = hyper["micro_batch_size"] * hyper["grad_accum"] * world
    steps = max(1, n_rows // per_step) * hyper["epochs"]
    return min(steps, hyper.get("max_steps") or steps)


def collate(rows, idx, seq_len: int, pad_id: int) -> dict:
    picked = [(r[0][:seq_len], r[1][:seq_len]) for r in (rows[i] for i in idx)]
    width = max(len(x) for x, _ in picked)
    ids = torch.full((len(picked), width), pad_id, dtype=torch.long)
    labels = torch.full((len(picked), width), -100, dtype=torch.long)
    attn = torch.zeros((len(picked), width), dtype=torch.long)
    for i, (x, m) in enumerate(picked):
        x = torch.as_tensor(x, dtype=torch.long)
        ids[i, : len(x)] = x
        attn[i, : len(x)] = 1
        labels[i, : len(x)] = torch.where(torch.as_tensor(m) == 1, x, -100)
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def build_model(base_model: str, init: str, hyper: dict):
    """The PEFT model to train: a fresh adapter on the base, or the init arm's, trainable."""
    from peft import LoraConfig, PeftModel, get_peft_model

    model = models.load_base(base_model)
    if init == "base":
        lora = hyper["lora"]
        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        unknown = sorted(set(lora["target_modules"]) - names)
        if unknown:
            raise SystemExit(f"lora.target_modules {unknown} do not name any module of {base_model}")
        cfg = LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                         target_modules=lora["target_modules"], task_type="CAUSAL_LM")
        return get_peft_model(model, cfg)
    return PeftModel.from_pretrained(model, init, is_trainable=True)


def deepspeed_config(hyper: dict, cuda: bool) -> dict:
    return {
        "train_micro_batch_size_per_gpu": hyper["micro_batch_size"],
        "gradient_accumulation_steps": hyper["grad_accum"],
        "gradient_clipping": hyper["max_grad_norm"],
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": cuda},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def save_adapter(engine, model, out_dir: Path, rank: int) -> None:
    """Gather the ZeRO-3 shards of the trainable parameters, then save on rank 0. Saving
    without the gather writes shape-(0,) tensors."""
    import deepspeed

    trainable = [p for p in model.parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters(trainable, modifier_rank=None):
        if rank == 0:
            model.save_pretrained(str(out_dir), safe_serialization=True)


def train(args) -> None:
    import deepspeed
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    hyper = json.loads(args.params_json)
    ensure_dist_env()
    cuda = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    log.info("arm %s: %s", args.arm, json.dumps(hyper, sort_keys=True))
    log.info("code: %s", json.dumps(manifest.code_version()))
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))

    rows, corpus_record = load_corpus(Path(args.corpus))
    torch.manual_seed(hyper["seed"])
    model = build_model(args.base_model, args.init, hyper)
    tokenizer = models.load_tokenizer(args.base_model)
    params = [p for p in model.parameters() if p.requires_grad]
    n_steps = total_steps(len(rows), hyper, world)
    optimizer = torch.optim.AdamW(params, lr=hyper["lr"], weight_decay=hyper["weight_decay"])
    warmup = math.ceil(hyper["warmup_ratio"] * n_steps)
    engine, optimizer, _, scheduler = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        # A callable, so the schedule wraps DeepSpeed's optimizer, and steps with it.
        lr_scheduler=lambda opt: get_cosine_with_min_lr_schedule_with_warmup(
            opt, warmup, n_steps, min_lr_rate=hyper["min_lr_ratio"]),
        config=deepspeed_config(hyper, cuda),
    )
    out = Path(args.out)
    metrics, tokens_seen, t0 = [], 0, time.time()
    step_loss, step_tok = [], 0
    for step, micro, idx in batches(len(rows), hyper, world, rank, hyper["epochs"]):
        if step > n_steps:
            break
        batch = {k: v.to(engine.device) for k, v in collate(rows, idx, hyper["seq_len"], tokenizer.pad_token_id).items()}
        loss = engine(**batch).loss
        engine.backward(loss)
        lrs = [g["lr"] for g in optimizer.param_groups]  # the LR this step applies
        engine.step()
        step_loss.append(loss.item())
        step_tok += int(batch["attention_mask"].sum())
        if micro == hyper["grad_accum"] - 1:
            tokens_seen += step_tok * world  # ranks see equal-sized shards of the global batch
            gn = engine.get_global_grad_norm()
            metrics.append({"step": step, "loss": float(np.mean(step_loss)),
                            "grad_norm": None if gn is None else float(gn), "lr": lrs,
                            "tokens_seen": tokens_seen, "elapsed_s": round(time.time() - t0, 2)})
            if rank == 0 and (step % 10 == 0 or step == n_steps):
                m = metrics[-1]
                log.info("step %d/%d | loss %.4f | grad_norm %s | lr %s | tok %d | %.1fs", step,
                         n_steps, m["loss"], m["grad_norm"], [f"{x:.2e}" for x in lrs], tokens_seen, m["elapsed_s"])
            step_loss, step_tok = [], 0
    wall = time.time() - t0

    # Every rank joins the gather inside save_adapter; only rank 0 writes.
    with io.atomic_dir(out) if rank == 0 else contextlib.nullcontext(out) as tmp:
        save_adapter(engine, model, tmp, rank)
        if rank == 0:
            evidence = {
                "arm": args.arm,
                "job_id": os.environ.get("SLURM_JOB_ID") or f"local-{socket.gethostname()}-{os.getpid()}",
                "optimizer_steps": len(metrics),
                "tokens_seen": tokens_seen,
                "dataset_sha256": corpus_record["digest"],
                "dataset_files_sha256": {k: v["sha256"] for k, v in corpus_record["files"].items()},
                "manifest_sha256": manifest.sha256_file(Path(args.corpus) / manifest.MANIFEST),
                "corpus": str(args.corpus_id or Path(args.corpus).name),
                "base_model": args.base_name or args.base_model,
                "base_revision": models.base_revision(args.base_model, args.base_revision),
                "init": Path(args.init).parent.name if args.init != "base" else "base",
                "hyperparameters": hyper,
                "world_size": world,
                "device": "cuda" if cuda else "cpu",
                "code": manifest.code_version(),
                "wall_time_s": round(wall, 2),
                "gpu_hours": round(wall * world / 3600, 4) if cuda else 0.0,
                "final_loss": metrics[-1]["loss"] if metrics else None,
            }
            io.write_json(tmp / "training_evidence.json", evidence)
            io.write_jsonl(tmp / "metrics.jsonl", metrics)
            manifest.write(tmp, params=hyper)
    if rank == 0:
        log.info("arm %s: %d steps, final loss %.4f, %.1fs -> %s", args.arm, len(metrics),
                 metrics[-1]["loss"], wall, out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", required=True, help="arm id")
    ap.add_argument("--params-json", required=True, help="the arm's merged hyperparameters as JSON")
    ap.add_argument("--corpus", required=True, help="corpora/{corpus} (its manifest must verify)")
    ap.add_argument("--corpus-id", default=None, help="corpus id for the evidence (default: dir name)")
    ap.add_argument("--init", required=True, help="'base' or the init arm's runs/{arm}/final")
    ap.add_argument("--base-model", required=True, help="base model directory")
    ap.add_argument("--base-name", default=None, help="base model name for the evidence")
    ap.add_argument("--base-revision", default=None, help="base revision (default: sha256 of weights)")
    ap.add_argument("--out", required=True, help="runs/{arm}/final")
    train(ap.parse_args(argv))


if __name__ == "__main__":
    main()
