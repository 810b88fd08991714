"""What a training's final save of SmolLM2's LoRA adapter costs: PEFT's save_pretrained as it is,
the same call handed the trainable tensors from one host copy (`host_copy` below), and
arenaflow's own (train/model.save_adapter: the entries matched to their parameters once, at
set-up, then written by safetensors with PEFT's config file).

    python benchmarks/adapter_save.py [--layers 30 --reps 7 --cpu --out results.json]

A SmolLM2-135M training on the H200 spends 0.09-0.16 s in PEFT's save with the GPU idle
(BENCHMARKS.md, runs 60-62: the save's `weights` part), against 0.6-0.9 s of steps for the
shortest arm, R220. PEFT walks the whole model (its state dict, the tuner's key prefixes, the
tensor-parallel check), clones every tensor that shares storage with another (under ZeRO-1/2 all
of them: views of one flat buffer), and writes a model card from a Jinja template compiled each
time; safetensors then moves each of the 420 adapter tensors to the host alone. This builds
SmolLM2-135M's shape (random weights, LoRA r 64 on all seven projections as train/model's
LoraConfig makes it, through train/lora_fused as a job has them, random adapter weights) held by a
one-rank ZeRO-2 bf16 DeepSpeed engine, as a job's are, and times the saves, alternating their
order, into fresh directories of one temporary directory; all must hold the same adapter bytes.
Prints the median seconds of each and PEFT's over each other's.

Measured (docs/benchmark-log.md): before the engine held the weights here, the one copy was
slower than PEFT's own on the H200 (x0.75-0.76) as on CPU: the per-tensor copies are not what the
save spends. On CPU, the weights held by the engine: PEFT's 51-54 ms, arenaflow's
20-21 ms (x2.5-2.6), the same bytes. On the H200: PEFT's 63-97 ms, arenaflow's 32-43 ms
(x2.0-2.2); the adapter's views moved to the host in one copy of their flat buffer first were
slower (48-61 ms), so safetensors still copies each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from gpu_bench import LORA  # sibling scripts
from overflow_check_cpu import smollm2_lora

from arenaflow import models
from arenaflow.train import model as tmodel
from arenaflow.train.dist import ensure_dist_env
from arenaflow.train.speed import lora_fused

FILES = models.ADAPTER_FILES


def build(layers: int, device: str):
    """(the PEFT model, its adapter plan): the model held by a one-rank ZeRO-2 bf16 engine."""
    import deepspeed

    net = smollm2_lora(layers, tmodel.lora_config(LORA))  # the job's task type: CAUSAL_LM
    lora_fused.fuse(net)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a fresh lora_B is zeros: give the file real content
        for p in net.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g))
    plan = tmodel.adapter_plan(net)
    ensure_dist_env()
    params = [p for p in net.parameters() if p.requires_grad]
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 2, "contiguous_gradients": False},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": True},
    }
    deepspeed.initialize(model=net.to(device), optimizer=torch.optim.AdamW(params), config=config)
    return net, plan


def host_copy(model) -> dict:
    """save_pretrained's `state_dict`: the trainable tensors moved to the host in one transfer
    per dtype (PEFT's own save walks the whole state dict, then moves each tensor alone)."""
    named = [(n, p.detach()) for n, p in model.named_parameters() if p.requires_grad]
    host = {}
    for dtype in dict.fromkeys(t.dtype for _, t in named):
        group = [(n, t) for n, t in named if t.dtype == dtype]
        flat = torch.cat([t.reshape(-1) for _, t in group]).cpu()
        parts = flat.split([t.numel() for _, t in group])
        host.update((n, part.view(t.shape)) for (n, t), part in zip(group, parts))
    return {"state_dict": host}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(save, out: Path, device: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    sync(device)
    t = time.perf_counter()
    save(out)
    return time.perf_counter() - t


def same_bytes(tmp: Path, ways) -> bool:
    """The same files as PEFT's; the config's target_modules may be in another order (PEFT
    writes a set's iteration order, arenaflow sorts it)."""
    return all(_content(tmp / w / f) == _content(tmp / "peft" / f) for w in ways for f in FILES)


def _content(path: Path):
    if path.name != "adapter_config.json":
        return path.read_bytes()
    cfg = json.loads(path.read_text())
    return {**cfg, "target_modules": sorted(cfg["target_modules"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--out", help="results JSON")
    args = ap.parse_args()
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    net, plan = build(args.layers, device)
    ways = {
        "peft": lambda d: net.save_pretrained(str(d), safe_serialization=True),
        "one_copy": lambda d: net.save_pretrained(
            str(d), safe_serialization=True, **host_copy(net)
        ),
        "arenaflow": lambda d: tmodel.save_adapter(net, plan, d),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for name in list(ways)[:: 1 if rep % 2 else -1]:
                times[name].append(timed(ways[name], Path(tmp) / name, device))
        same = same_bytes(Path(tmp), ways)
    tensors = sum(p.requires_grad for p in net.parameters())
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "layers": args.layers,
        "adapter_tensors": tensors,
        "seconds": times,
        "median_s": med,
        "peft_over": {k: med["peft"] / v for k, v in med.items() if k != "peft"},
        "same_bytes": same,
    }
    print(
        f"{result['device']}: {tensors} adapter tensors, median of {args.reps} saves: "
        + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items())
        + "; PEFT's over "
        + ", ".join(f"{k}'s x{v:.2f}" for k, v in result["peft_over"].items())
        + f"; same bytes: {same}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if not same:
        raise SystemExit("the saves differ")


if __name__ == "__main__":
    main()
