"""arenaflow.decode.kernels' GEMVs on one GPU, each kind of product alone.

    python benchmarks/gemv_fused_gpu.py

The batch-1 products of the 1.2 B shape (gpu_bench's) with what the step folds into them (the
RMSNorm before QKV, gate/up and lm_head; SwiGLU after gate/up; the residual add after o and
down), each over one weight per layer replayed in a CUDA graph (gemv_gpu.replay_us), the plain
product beside the fused ones: microseconds a call, GB/s of weights, and the step's products
summed (24 layers + lm_head).
"""

from __future__ import annotations

import torch
from gemv_gpu import HIDDEN, INTER, LAYERS, PRODUCTS, VOCAB, replay_us

from arenaflow.decode import kernels as decode_kernels

CASES = {  # name: (weight rows, in features, what is folded in, calls a step)
    "qkv + norm": (PRODUCTS["qkv"][0], HIDDEN, ("norm",), LAYERS),
    "qkv plain": (PRODUCTS["qkv"][0], HIDDEN, (), 0),
    "o + residual": (HIDDEN, HIDDEN, ("residual",), LAYERS),
    "gate/up + norm + swiglu": (2 * INTER, HIDDEN, ("norm", "swiglu"), LAYERS),
    "gate/up plain": (2 * INTER, HIDDEN, (), 0),
    "down + residual": (HIDDEN, INTER, ("residual",), LAYERS),
    "lm_head + norm": (VOCAB, HIDDEN, ("norm",), 1),
}


def time_case(rows: int, k: int, folded: tuple, copies: int) -> float:
    new = dict(device="cuda", dtype=torch.bfloat16)
    ws = [torch.randn(rows, k, **new) for _ in range(copies)]  # no weight read from L2
    x, g = torch.randn(k, **new), torch.rand(k, **new)
    out = rows // 2 if "swiglu" in folded else rows
    kw = {
        "norm": g if "norm" in folded else None,
        "eps": 1e-5,
        "swiglu": "swiglu" in folded,
        "residual": torch.randn(out, **new) if "residual" in folded else None,
    }
    return replay_us(lambda: [decode_kernels.gemv(x, w, **kw) for w in ws], reps=8) / copies


def main() -> None:
    torch.manual_seed(0)
    step = 0.0
    for name, (rows, k, folded, calls) in CASES.items():
        us = time_case(rows, k, folded, max(calls, 4))
        step += us * calls
        print(f"{name:24s} {us:7.2f} us  {rows * k * 2 / us / 1e3:6.0f} GB/s", flush=True)
    print(f"a step's products: {step:.1f} us")


if __name__ == "__main__":
    main()
