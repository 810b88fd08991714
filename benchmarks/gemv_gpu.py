"""Batch-1 decode products on one GPU: cuBLAS (F.linear) against an autotuned Triton GEMV.

    python benchmarks/gemv_gpu.py [--out gemv.json]

At batch 1 the llama step's products are matrix-vector products, and cuBLAS's small-M tiles ran
them at about half the bandwidth on the H200 (BENCHMARKS.md: 1.00 ms of a 1.28 ms step, for ~0.54
ms of weight reads). This times each product of gpu_bench's 1.2 B shape (packed QKV, o, packed
gate/up, down, lm_head; bf16), both ways, over one weight per layer (24 distinct weights: no
product finds its weight in the L2 cache) replayed in a CUDA graph, checks the Triton result
against F.linear's, and prints GB/s and the step's products summed (24 layers + lm_head) both ways,
with their ratio.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

HIDDEN, INTER, HEADS, KV_HEADS, VOCAB, LAYERS = 2048, 5632, 16, 4, 32000, 24
HEAD_DIM = HIDDEN // HEADS
PRODUCTS = {  # name: (out features, in features), as nn.Linear's weight
    "qkv": (HIDDEN + 2 * KV_HEADS * HEAD_DIM, HIDDEN),
    "o": (HIDDEN, HIDDEN),
    "gate_up": (2 * INTER, HIDDEN),
    "down": (HIDDEN, INTER),
    "lm_head": (VOCAB, HIDDEN),
}
CONFIGS = [
    triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
    for n in (2, 4, 8, 16)
    for k in (256, 512, 1024)
    for w in (2, 4, 8)
    for s in (1, 3)
]


@triton.autotune(configs=CONFIGS, key=["N", "K"])
@triton.jit
def gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[n] = sum_k w[n, k] * x[k], BLOCK_N rows per program, float32 accumulation."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        inside = (rows[:, None] < N) & (cols[None, :] < K)
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=inside, other=0.0)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(y_ptr + rows, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=rows < N)


def gemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    y = torch.empty(n, device=x.device, dtype=x.dtype)
    gemv_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](x, w, y, n, k)
    return y


def replay_us(fn, reps: int = 200) -> float:
    """Microseconds per call, from a CUDA graph of `reps` calls (no launch overhead)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON results")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows, total = [], {"cublas": 0.0, "triton": 0.0}
    for name, (n, k) in PRODUCTS.items():
        times = 1 if name == "lm_head" else LAYERS
        # one weight per layer, as in the model: a product replayed on one weight would read it
        # from the 50 MB L2 cache after the first time, not from memory
        copies = max(times, 4)  # lm_head's 4 copies: 4 x 131 MB
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        w = ws[0]
        ref = torch.nn.functional.linear(x, w)[0]
        got = gemv(x[0], w)
        err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()

        def each(fn, ws=ws, x=x):
            return lambda: [fn(x, w) for w in ws]

        us = {
            "cublas": replay_us(each(torch.nn.functional.linear), reps=8) / copies,
            "triton": replay_us(each(lambda x, w: gemv(x[0], w)), reps=8) / copies,
        }
        gbytes = w.numel() * 2 / 1e9
        for kind in total:
            total[kind] += us[kind] * times
        row = {
            "product": name,
            "shape": [n, k],
            "us": {kk: round(v, 2) for kk, v in us.items()},
            "gb_per_s": {kk: round(gbytes / (v * 1e-6), 1) for kk, v in us.items()},
            "triton_config": str(gemv_kernel.best_config),
            "max_rel_err": err,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {
        "step_products_us": {k: round(v, 1) for k, v in total.items()},
        "cublas_over_triton": round(total["cublas"] / total["triton"], 3),
    }
    print(json.dumps(summary), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            record = {"device": torch.cuda.get_device_name(), "rows": rows, **summary}
            json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
