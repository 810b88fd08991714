"""What a training's final save of SmolLM2's LoRA adapter costs: PEFT's save_pretrained as it is,
against the same call handed the trainable tensors from one host copy (`host_copy` below).

    python benchmarks/adapter_save.py [--layers 30 --reps 7 --cpu --out results.json]

Issue 15: a SmolLM2-135M training on the H200 spends 0.09-0.16 s in PEFT's save with the GPU idle
(BENCHMARKS.md, runs 60-62: the save's `weights` part), against 0.6-0.9 s of steps for the
shortest arm, R220. PEFT walks the model's whole state dict and safetensors moves each of the 420
adapter tensors to the host alone, a synchronised copy apiece. This builds SmolLM2-135M's shape
(random weights, bf16, LoRA r 64 on all seven projections, train/lora_fused's modules as a job
has them), gives the adapter random weights, and times both saves, alternating which goes first,
into fresh directories in one temporary directory; the two must hold the same bytes. Prints the
median seconds of each and their ratio.

Measured (BENCHMARKS.md, session 29): the one copy is slower, on the H200 (x0.75-0.76: PEFT's
111 / 92 ms against 146 / 124 ms) as on CPU: the per-tensor copies were not what the save
spends, so train/model.save keeps PEFT's own way. Kept as the record and for the next idea.
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
from overflow_check_cpu import smollm2_lora  # sibling scripts

from arenaflow.train import lora_fused


def build(layers: int, device: str):
    net = smollm2_lora(layers).to(device, torch.bfloat16)
    lora_fused.fuse(net)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a fresh lora_B is zeros: give the file real content
        for p in net.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g))
    return net


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--out", help="results JSON")
    args = ap.parse_args()
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    net = build(args.layers, device)
    ways = {
        "peft": lambda d: net.save_pretrained(str(d), safe_serialization=True),
        "one_copy": lambda d: net.save_pretrained(
            str(d), safe_serialization=True, **host_copy(net)
        ),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for name in list(ways)[:: 1 if rep % 2 else -1]:
                times[name].append(timed(ways[name], Path(tmp) / name, device))
        same = all(
            (Path(tmp) / "peft" / f.name).read_bytes() == f.read_bytes()
            for f in (Path(tmp) / "one_copy").iterdir()
        ) and len(list((Path(tmp) / "peft").iterdir())) == len(
            list((Path(tmp) / "one_copy").iterdir())
        )
    tensors = sum(p.requires_grad for p in net.parameters())
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "layers": args.layers,
        "adapter_tensors": tensors,
        "seconds": times,
        "median_s": med,
        "peft_over_one_copy": med["peft"] / med["one_copy"],
        "same_bytes": same,
    }
    print(
        f"{result['device']}: {tensors} adapter tensors; PEFT's save {med['peft'] * 1e3:.1f} ms, "
        f"from one host copy {med['one_copy'] * 1e3:.1f} ms (median of {args.reps}): "
        f"x{result['peft_over_one_copy']:.2f}; same bytes: {same}"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if not same:
        raise SystemExit("the two saves differ")


if __name__ == "__main__":
    main()
