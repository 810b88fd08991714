"""Triton kernels for the batch-1 decode step on CUDA (issue #23); imported only there.

At batch 1 a decode step is bound by reading the weights once, and the compiled Llama step spent
1.00 of its 1.28 ms of kernels in cuBLAS's matrix products, whose small-M tiles read the weights
at about half the bandwidth (BENCHMARKS.md; benchmarks/gemv_gpu.py: a plain Triton GEMV reads
them x1.2 faster). The rest was ~10 small kernels a layer. Here:

- `gemv`: y = W x, one program per BLOCK_N rows, float32 accumulation, with the kernels around a
  product folded into it: the RMSNorm before QKV, gate/up and lm_head (every program recomputes
  the norm of x: 4 KB from L2 against the rows' weights from memory), SwiGLU before down, the
  residual add after o and down.
- `attend`: one token's grouped-query attention over the cache, one program per (row, KV head)
  reading each cached key and value once, an online softmax across key blocks.

Both round where transformers' modelling code rounds (the norm's output and the weight's product
in the model's dtype, silu and the product with up, the product before the residual add) so
that the step chooses generate()'s tokens up to summation order. Registered with
torch.library.triton_op, so that a fullgraph torch.compile keeps the kernels inside its graph
(and the CUDA graph captures them with the rest).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

# best of benchmarks/gemv_gpu.py's 72 on the H200 was BLOCK_N 2, BLOCK_K 1024, 4 warps for every
# product: the neighbours of that, few enough that the first call autotunes in seconds
GEMV_CONFIGS = [
    triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=4, num_stages=s)
    for n in (1, 2, 4, 8)
    for k in (512, 1024)
    for s in (1, 3)
]


@triton.autotune(configs=GEMV_CONFIGS, key=["N", "K", "NORM", "SWIGLU", "RESIDUAL"])
@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    g_ptr,
    r_ptr,
    y_ptr,
    N,
    K,
    eps,
    NORM: tl.constexpr,
    SWIGLU: tl.constexpr,
    RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    dt = y_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    if NORM:  # LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in float32, to dt, times g in dt
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
            squares += x * x
        inv_rms = tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        inside = cols < K
        if SWIGLU:  # x holds gate then up (K each): silu(gate) * up, each rounded to dt
            gate = tl.load(x_ptr + cols, mask=inside, other=0.0).to(tl.float32)
            up = tl.load(x_ptr + K + cols, mask=inside, other=0.0).to(tl.float32)
            act = (gate * tl.sigmoid(gate)).to(dt).to(tl.float32)
            x = (act * up).to(dt).to(tl.float32)
        else:
            x = tl.load(x_ptr + cols, mask=inside, other=0.0).to(tl.float32)
            if NORM:
                g = tl.load(g_ptr + cols, mask=inside, other=0.0).to(tl.float32)
                x = (g * (x * inv_rms).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        within = (rows[:, None] < N) & inside[None, :]
        w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=within, other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1).to(dt)
    if RESIDUAL:
        y = (tl.load(r_ptr + rows, mask=rows < N).to(tl.float32) + y.to(tl.float32)).to(dt)
    tl.store(y_ptr + rows, y, mask=rows < N)


@triton_op("arenaflow::gemv", mutates_args=())
def _gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    norm: torch.Tensor,
    residual: torch.Tensor,
    eps: float,
    use_norm: bool,
    swiglu: bool,
    use_residual: bool,
) -> torch.Tensor:
    n, k = w.shape
    y = torch.empty(n, dtype=w.dtype, device=w.device)

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_N"]),)

    wrap_triton(_gemv_kernel)[grid](
        x, w, norm, residual, y, n, k, eps, NORM=use_norm, SWIGLU=swiglu, RESIDUAL=use_residual
    )
    return y


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    norm: torch.Tensor | None = None,
    eps: float = 0.0,
    swiglu: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """W [N, K] times one vector x: [N] in W's dtype. x is [K], or with `swiglu` [2K] (gate then
    up: W sees silu(gate) * up); `norm` (the RMSNorm's weight [K], with `eps`) normalises x
    first; `residual` [N] is added to the product."""
    k = w.shape[1]
    want = 2 * k if swiglu else k
    if x.numel() != want:
        raise ValueError(f"gemv: x has {x.numel()} elements; W {tuple(w.shape)} needs {want}")
    # unused pointers get x: the kernel never reads them (their branches are compiled out)
    return _gemv(
        x.reshape(-1).contiguous(),
        w,
        x if norm is None else norm,
        x if residual is None else residual.reshape(-1).contiguous(),
        float(eps),
        norm is not None,
        swiglu,
        residual is not None,
    )


@triton.jit
def _attend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    visible_ptr,
    cursor_ptr,
    o_ptr,
    seen,
    cache_rows,
    visible_stride,
    scale,
    KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    dt = o_ptr.dtype.element_ty
    row, head = tl.program_id(0), tl.program_id(1)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, DIM)
    q_at = ((row * KV_HEADS + head) * GROUP + g[:, None]) * DIM + d[None, :]
    q = tl.load(q_ptr + q_at, mask=g[:, None] < GROUP, other=0.0)  # [GROUP_PAD, DIM]
    cursor = tl.load(cursor_ptr)
    cache = (row * KV_HEADS + head) * cache_rows * DIM
    # finite, so that a block hidden entirely (left padding) gives exp(0) corrections, not NaN
    best = tl.full((GROUP_PAD,), -1.0e30, dtype=tl.float32)
    total = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((GROUP_PAD, DIM), dtype=tl.float32)
    for s0 in range(0, seen, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        inside = s < seen
        # rows past `seen` load zeros: their weight is 0, and 0 * (stale NaN) would not be
        keys = tl.load(
            k_ptr + cache + s[:, None] * DIM + d[None, :], mask=inside[:, None], other=0.0
        )
        # the scores are rounded to dt as transformers' q @ k^T product is, then scaled
        scores = tl.dot(q, tl.trans(keys)).to(dt).to(tl.float32) * scale
        shown = tl.load(visible_ptr + row * visible_stride + s, mask=inside, other=0)
        allowed = inside & (shown != 0) & (s <= cursor)
        scores = tl.where(allowed[None, :], scores, float("-inf"))
        top = tl.maximum(best, tl.max(scores, axis=1))
        fade = tl.exp(best - top)
        p = tl.exp(scores - top[:, None])
        total = total * fade + tl.sum(p, axis=1)
        values = tl.load(
            v_ptr + cache + s[:, None] * DIM + d[None, :], mask=inside[:, None], other=0.0
        )
        acc = acc * fade[:, None] + tl.dot(p.to(dt), values)
        best = top
    out = (acc / total[:, None]).to(dt)
    tl.store(o_ptr + q_at, out, mask=g[:, None] < GROUP)


@triton_op("arenaflow::attend", mutates_args=())
def _attend(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    visible: torch.Tensor,
    cursor: torch.Tensor,
    seen: int,
    scale: float,
) -> torch.Tensor:
    batch, heads, dim = q.shape
    kv_heads, cache_rows = cache_k.shape[1], cache_k.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    wrap_triton(_attend_kernel)[(batch, kv_heads)](
        q,
        cache_k,
        cache_v,
        visible,
        cursor,
        out,
        seen,
        cache_rows,
        visible.stride(0),
        scale,
        KV_HEADS=kv_heads,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),  # tl.dot's smallest M
        DIM=dim,
        BLOCK_S=64,
    )
    return out


def attend(q, cache_k, cache_v, visible, cursor, seen: int, scale: float) -> torch.Tensor:
    """One token's attention: q [B, H, D] over the first `seen` rows of the cache
    ([B, H_kv, L, D] each, contiguous) that `visible` [B, >= seen] (bool) shows and that are at
    or before row `cursor` (a 0-d long tensor); [B, H, D]."""
    for name, t in (("cache_k", cache_k), ("cache_v", cache_v)):
        if not t.is_contiguous():
            raise ValueError(f"attend: {name} must be contiguous (stride {t.stride()})")
    return _attend(q.contiguous(), cache_k, cache_v, visible, cursor, seen, float(scale))
