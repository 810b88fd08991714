"""Triton kernels for the batch-1 decode step on CUDA; imported only there.

At batch 1 a decode step is bound by reading the weights once, and the compiled Llama step spent
1.00 of its 1.28 ms of kernels in cuBLAS's matrix products, whose small-M tiles read the weights
at about half the bandwidth (BENCHMARKS.md; benchmarks/gemv_gpu.py: a plain Triton GEMV reads
them x1.2 faster). The rest was ~10 small kernels a layer. Here:

- `gemv`: y = W x, one program per BLOCK_N rows, float32 accumulation, with the kernels around a
  product folded into it: the RMSNorm before QKV, gate/up and lm_head (x is read once: its
  squares summed beside the product, which is scaled by rsqrt(mean(x^2) + eps) at the end), the
  SwiGLU after gate/up (a program takes the same rows of gate and of up), the residual add after
  o and down.
- `attend`: one token's grouped-query attention over the cache, reading each cached key and
  value once: a program per (row, KV head, block of 32 keys) computes a partial softmax for the
  query heads sharing that KV head, and a reduction joins the blocks (flash-decoding).

They round as transformers' modelling code does wherever it rounds a tensor it keeps (each
product's output, silu(gate) and its product with up, the residual sum, the scores and the
attention's output); the normalised input is the one rounding they skip, as a fused norm does
(each input element ~2^-9 closer; the step chooses generate()'s tokens up to bf16 ties, which
benchmarks/gpu_bench.py's tie check scores). Registered with
torch.library.triton_op, so that a fullgraph torch.compile keeps the kernels inside its graph
(and the CUDA graph captures them with the rest).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


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
    """y[n] = sum_k W[n, k] x[k] for N output rows. NORM: x is RMSNorm(x) * g, applied as
    rsqrt(mean(x^2) + eps) * sum_k W[n, k] g[k] x[k] (one pass over x). SWIGLU: W holds 2N rows
    (gate then up) and y[n] = silu(gate[n]) * up[n]. RESIDUAL: y[n] += r[n]."""
    dt = y_ptr.dtype.element_ty
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if SWIGLU:
        acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        inside = cols < K
        x = tl.load(x_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        if NORM:
            squares += x * x
            x = x * tl.load(g_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        within = (rows[:, None] < N) & inside[None, :]
        at = w_ptr + rows[:, None] * K + cols[None, :]
        acc += tl.load(at, mask=within, other=0.0).to(tl.float32) * x[None, :]
        if SWIGLU:
            acc_up += tl.load(at + N * K, mask=within, other=0.0).to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if NORM:  # float scalars may arrive as fp64 (inductor passes them so): the cast keeps fp32
        inv_rms = tl.rsqrt((tl.sum(squares, axis=0) / K + eps).to(tl.float32))
        y = y * inv_rms
    y = y.to(dt)
    if SWIGLU:  # the modelling code's roundings: gate and up, silu(gate), their product
        up = tl.sum(acc_up, axis=1)
        if NORM:
            up = up * inv_rms
        gate = y.to(tl.float32)
        act = (gate * tl.sigmoid(gate)).to(dt).to(tl.float32)
        y = (act * up.to(dt).to(tl.float32)).to(dt)
    if RESIDUAL:
        y = (tl.load(r_ptr + rows, mask=rows < N).to(tl.float32) + y.to(tl.float32)).to(dt)
    tl.store(y_ptr + rows, y, mask=rows < N)


# one config per kind of product, fixed: with an autotune list the compiled step's GEMVs took
# 0.96 ms a step on the H200 where the same kernels autotuned eagerly took 0.78 ms, so the configs
# no longer depend on how inductor autotunes. Each won the eager autotune over 5 configs on the
# 1.2 B shape's products there (docs/benchmark-log.md), but for down, whose winner was BLOCK_N 1
# and which shares o's kind: wider rows pay back where more than x is read beside the weights
# (the norm's weight, up's rows)
GEMV_CONFIGS = {  # (norm, swiglu): BLOCK_N, BLOCK_K, warps
    (False, False): (2, 1024, 4),  # o (and the plain sweep's best: benchmarks/gemv_gpu.py), down
    (True, False): (8, 512, 8),  # QKV, lm_head
    (True, True): (4, 1024, 4),  # gate/up
    (False, True): (4, 1024, 4),
}
_GEMV_KERNELS = {
    kind: triton.autotune(
        configs=[triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=1)],
        key=[],
    )(_gemv_kernel)
    for kind, (n, k, w) in GEMV_CONFIGS.items()
}


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
    n = n // 2 if swiglu else n
    y = torch.empty(n, dtype=w.dtype, device=w.device)

    def grid(meta):
        return (triton.cdiv(n, meta["BLOCK_N"]),)

    wrap_triton(_GEMV_KERNELS[use_norm, swiglu])[grid](
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
    """W [N, K] times one vector x [K]: [N] in W's dtype. `norm` (the RMSNorm's weight [K],
    with `eps`) normalises x first; `swiglu`: W is gate and up packed ([2M, K]) and the result
    silu(gate x) * (up x), [M]; `residual` [N or M] is added to the result."""
    if x.numel() != w.shape[1]:
        raise ValueError(f"gemv: x has {x.numel()} elements; W {tuple(w.shape)} needs {w.shape[1]}")
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


# split across the keys (flash-decoding): at batch 1 one program per (row, KV head) made a chain
# of key blocks one program long (0.19-0.20 ms a step of 24 layers on the H200, no faster than
# the two grouped products and the masked softmax it replaced); a program per block of keys runs
# them side by side, and a reduction over the blocks (torch ops: one fused kernel once compiled)
# joins their partial softmaxes
ATTEND_BLOCK = 32


@triton.jit
def _attend_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    visible_ptr,
    cursor_ptr,
    best_ptr,
    total_ptr,
    acc_ptr,
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
    """For one row, KV head and block of keys: each query head's highest score (best), its sum
    of exp(score - best) (total) and that sum's weighting of the values (acc), float32."""
    dt = q_ptr.dtype.element_ty
    row, head, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    blocks = tl.num_programs(2)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, DIM)
    heads = (row * KV_HEADS + head) * GROUP + g  # the query heads that read this KV head
    q = tl.load(q_ptr + heads[:, None] * DIM + d[None, :], mask=g[:, None] < GROUP, other=0.0)
    cache = (row * KV_HEADS + head) * cache_rows * DIM
    s = block * BLOCK_S + tl.arange(0, BLOCK_S)
    inside = s < seen
    # rows past `seen` load zeros: their weight is 0, and 0 * (stale NaN) would not be
    keys = tl.load(k_ptr + cache + s[:, None] * DIM + d[None, :], mask=inside[:, None], other=0.0)
    # the scores are rounded to dt as transformers' q @ k^T product is, then scaled (float
    # scalars may arrive as fp64: the cast keeps fp32)
    scores = (tl.dot(q, tl.trans(keys)).to(dt).to(tl.float32) * scale).to(tl.float32)
    shown = tl.load(visible_ptr + row * visible_stride + s, mask=inside, other=0)
    allowed = inside & (shown != 0) & (s <= tl.load(cursor_ptr))
    scores = tl.where(allowed[None, :], scores, float("-inf"))
    # finite, so that a block hidden entirely (left padding) weighs exp(-inf) = 0, not NaN
    best = tl.maximum(tl.max(scores, axis=1), -1.0e30)
    p = tl.exp(scores - best[:, None])
    values = tl.load(v_ptr + cache + s[:, None] * DIM + d[None, :], mask=inside[:, None], other=0.0)
    acc = tl.dot(p.to(dt), values)
    part = heads * blocks + block
    tl.store(best_ptr + part, best, mask=g < GROUP)
    tl.store(total_ptr + part, tl.sum(p, axis=1), mask=g < GROUP)
    tl.store(acc_ptr + part[:, None] * DIM + d[None, :], acc, mask=g[:, None] < GROUP)


@triton_op("arenaflow::attend_blocks", mutates_args=())
def _attend_blocks(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    visible: torch.Tensor,
    cursor: torch.Tensor,
    seen: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, heads, dim = q.shape
    kv_heads, cache_rows = cache_k.shape[1], cache_k.shape[2]
    blocks = triton.cdiv(seen, ATTEND_BLOCK)
    new = dict(dtype=torch.float32, device=q.device)
    best = torch.empty(batch, heads, blocks, **new)
    total = torch.empty(batch, heads, blocks, **new)
    acc = torch.empty(batch, heads, blocks, dim, **new)
    group = heads // kv_heads
    wrap_triton(_attend_kernel)[(batch, kv_heads, blocks)](
        q,
        cache_k,
        cache_v,
        visible,
        cursor,
        best,
        total,
        acc,
        seen,
        cache_rows,
        visible.stride(0),
        scale,
        KV_HEADS=kv_heads,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),  # tl.dot's smallest M
        DIM=dim,
        BLOCK_S=ATTEND_BLOCK,
    )
    return best, total, acc


def attend(q, cache_k, cache_v, visible, cursor, seen: int, scale: float) -> torch.Tensor:
    """One token's attention: q [B, H, D] over the first `seen` rows of the cache
    ([B, H_kv, L, D] each, contiguous) that `visible` [B, >= seen] (bool) shows and that are at
    or before row `cursor` (a 0-d long tensor); [B, H, D] in q's dtype."""
    for name, t in (("cache_k", cache_k), ("cache_v", cache_v)):
        if not t.is_contiguous():
            raise ValueError(f"attend: {name} must be contiguous (stride {t.stride()})")
    best, total, acc = _attend_blocks(
        q.contiguous(), cache_k, cache_v, visible, cursor, seen, float(scale)
    )
    weight = torch.exp(best - best.amax(-1, keepdim=True))  # each block's share, [B, H, blocks]
    out = (weight[..., None] * acc).sum(-2) / (weight * total).sum(-1, keepdim=True)
    return out.to(q.dtype)
