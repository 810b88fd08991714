"""A Llama-family forward pass as one pure function over packed weights.

transformers' modelling code runs a decode step as ~775 small kernels (per layer: two norms,
rotary cat/mul, a cache index_copy, masks, residual adds, seven projections). Written as one
function of plain tensors, the step traces into ONE torch.compile graph (fullgraph) in which
inductor fuses norms, rotary, residual adds and the cache write into a few kernels between the
matrix products, and the products shrink from seven to four a layer: QKV and gate/up are each
one matrix, packed at load from the model's own (already LoRA-merged) weights.

The formula is transformers' LlamaForCausalLM's, term for term (RMSNorm in float32, rotary
q*cos + rotate_half(q)*sin with transformers' own cos/sin for each position, SwiGLU, residuals),
so that greedy decoding gives generate()'s tokens (tests/unit/test_decode.py).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from arenaflow import engine, models
from arenaflow.fused import rms_norm

# the batch-1 kernels need triton, which CUDA builds of torch bring and CPU builds do not, and
# torch.library's triton_op and wrap_triton (torch >= 2.6)
if importlib.util.find_spec("triton") is not None and hasattr(torch.library, "wrap_triton"):
    from arenaflow.decode import kernels as decode_kernels
else:
    decode_kernels = None

# how a decoding token attends over the cache: "matmul" (two grouped-query products and a
# masked softmax between them; the default above batch 1), "triton" (arenaflow.decode.kernels'
# one kernel a layer; the default at batch 1 on CUDA, see engine decode_kernels) or "flex"
# (FlexAttention: inductor's flex-decoding kernel; slower on the H200 at batch 1 and 256,
# BENCHMARKS.md); engine decode_attention picks one, or auto
ATTENTIONS = ("matmul", "triton", "flex")
# engine decode_kernels "auto": at batch 1 on CUDA, in bf16/fp16, products, norms, SwiGLU and
# residual adds run as arenaflow.decode.kernels' GEMVs and the attention as its kernel; "off":
# inductor's kernels and cuBLAS's products, as at every other batch size


@dataclass(frozen=True)
class Shape:
    """The numbers of a Llama config that the forward pass needs, and the decode attention
    (constants to the compiler)."""

    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    eps: float
    attention: str = "matmul"
    small: bool = False  # one token a step: decode_kernels' GEMVs for the products


def unsupported(model) -> str | None:
    """Why `model` cannot decode through this module (None: it can). Only plain
    LlamaForCausalLM: a PEFT wrapper (an unmerged adapter), biases, another activation or
    another architecture keep transformers' modelling code."""
    cfg = model.config
    name = type(model).__name__
    if name != "LlamaForCausalLM" or getattr(cfg, "model_type", None) != "llama":
        return f"{name} (model_type {getattr(cfg, 'model_type', None)!r}) is not LlamaForCausalLM"
    for key, ok in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu")):
        if getattr(cfg, key, ok) != ok:
            return f"LlamaForCausalLM with {key}={getattr(cfg, key)!r} (expected {ok!r})"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return f"LlamaForCausalLM with pretraining_tp={cfg.pretraining_tp} (expected 1)"
    return models.partial_rotary(model)  # its tables rotate whole heads


def _signature(model) -> tuple:
    # where and at which in-place version each weight is: an optimizer step or a reload changes
    # it, and the packed copy must then be rebuilt (it decodes the weights as they are now)
    return tuple((p.data_ptr(), p._version) for p in model.parameters())


def packed(model) -> dict:
    """The model's weights for `forward`, QKV and gate/up packed into one matrix each per layer.
    Cached on the model; rebuilt when any of its weights changed since (in place or replaced)."""
    sig = _signature(model)
    kept = model.__dict__.get("_arenaflow_packed")
    if kept is not None and kept[0] == sig:
        return kept[1]
    model.__dict__.pop("_arenaflow_packed", None)  # the stale copy goes before the new one
    inner = model.model
    layers = []
    with torch.no_grad():
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            qkv = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight])
            gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            layers.append(
                (
                    layer.input_layernorm.weight.detach(),
                    qkv,
                    att.o_proj.weight.detach(),
                    layer.post_attention_layernorm.weight.detach(),
                    gate_up,
                    mlp.down_proj.weight.detach(),
                )
            )
    weights = {
        "embed": inner.embed_tokens.weight.detach(),
        "layers": layers,
        "norm": inner.norm.weight.detach(),
        "lm_head": model.lm_head.weight.detach(),
    }
    model.__dict__["_arenaflow_packed"] = (sig, weights)
    return weights


def shape_of(model, batch: int | None = None) -> Shape:
    """The model's Shape, for decoding `batch` rows a step (None: any batch)."""
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    fits = _kernels_fit(model, head_dim)
    wanted = _kernels_wanted()  # checked everywhere: a bad value is named on CPU too
    small = batch == 1 and fits and wanted
    attention = engine.get("decode_attention")
    attention = ("triton" if small else "matmul") if attention == "auto" else attention
    if attention not in ATTENTIONS:
        raise ValueError(f"engine decode_attention {attention!r}: expected one of {ATTENTIONS}")
    if attention == "triton" and not fits:
        raise ValueError("engine decode_attention triton needs a CUDA model in bf16 or fp16")
    return Shape(
        heads=heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        inter=cfg.intermediate_size,
        eps=cfg.rms_norm_eps,
        attention=attention,
        small=small,
    )


def _kernels_wanted() -> bool:
    want = engine.get("decode_kernels")
    if want not in ("auto", "off"):
        raise ValueError(f"engine decode_kernels {want!r}: expected 'auto' or 'off'")
    return want == "auto"


def _kernels_fit(model, head_dim: int) -> bool:
    """Whether decode_kernels can run this model's step: CUDA, a 16-bit dtype (float32 keeps
    torch's products, exact for the tests), a power-of-two head size (tl.arange), triton."""
    return (
        decode_kernels is not None
        and model.device.type == "cuda"
        and model.dtype in (torch.bfloat16, torch.float16)
        and head_dim >= 16
        and head_dim & (head_dim - 1) == 0
    )


@torch.no_grad()
def rotary_tables(model, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [length, head_dim] for positions 0..length-1, from the model's own rotary
    module (so any rope scaling it has, e.g. Llama 3's, is the model's), in the model's dtype."""
    rotary = model.model.rotary_emb
    probe = torch.zeros(1, dtype=model.dtype, device=model.device)
    cos, sin = rotary(probe, torch.arange(length, device=model.device)[None])
    return cos[0].contiguous(), sin[0].contiguous()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _attend(q, k, v, cache_k, cache_v, rows, mask, s: Shape) -> torch.Tensor:
    """Writes k, v [B, H_kv, T, D] at cache `rows`, then attends; [B, T, H * D].

    One token (decoding): over the first mask.shape[-1] cache rows, each KV head read once for
    the G query heads sharing it ([B, H_kv, G, D] x [B, H_kv, D, S]). A prompt (T > 1): over its
    own keys with SDPA, the KV heads repeated as transformers' repeat_kv does."""
    batch, _, t, dim = q.shape
    # in place into graph inputs (gpt-fast's pattern): inductor writes the rows and nothing else
    cache_k[:, :, rows] = k
    cache_v[:, :, rows] = v
    scale = dim**-0.5
    if t > 1:
        group = s.heads // s.kv_heads
        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return out.transpose(1, 2).reshape(batch, t, s.heads * dim)
    if s.attention == "triton":
        out = decode_kernels.attend(
            q.reshape(batch, s.heads, dim), cache_k, cache_v, *mask, scale=scale
        )
        return out.reshape(batch, 1, s.heads * dim)
    if isinstance(mask, Keys):
        k, v = cache_k[:, :, : mask.seen], cache_v[:, :, : mask.seen]
        out = _flex_decode(q, k, v, mask, scale)
        return out.transpose(1, 2).reshape(batch, 1, s.heads * dim)
    seen = mask.shape[-1]
    qg = q.reshape(batch, s.kv_heads, s.heads // s.kv_heads, dim)
    scores = torch.matmul(qg, cache_k[:, :, :seen].transpose(-1, -2)).float() * scale
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1).to(q.dtype)
    out = torch.matmul(probs, cache_v[:, :, :seen])
    return out.reshape(batch, 1, s.heads * dim)


class Keys(NamedTuple):
    """The cache rows a decoding token may attend to, for FlexAttention: rows 0..seen-1 that are
    visible (not left padding) and not past the cursor. Graph inputs themselves, not a mask
    computed from them: inductor's CPU flex template takes only inputs into its score function."""

    visible: torch.Tensor  # [B, >= seen] bool
    cursor: torch.Tensor  # () long, the row the token is written to
    seen: int


def decode_mask(s: Shape, visible, cursor, seen_rows):
    """What a decoding token written at cache row `cursor` may attend to: the rows `seen_rows`
    (0..S-1) up to the cursor that `visible` [B, >= S] does not hide (left padding), in the form
    `s.attention` reads (Keys for flex and triton, else a bool mask [B, 1, 1, S])."""
    if s.attention in ("flex", "triton"):
        return Keys(visible, cursor, seen_rows.shape[0])
    return (visible[:, : seen_rows.shape[0]] & (seen_rows <= cursor))[:, None, None]


def _flex_decode(q, k, v, keys: Keys, scale: float) -> torch.Tensor:
    """q [B, H, 1, D] over k, v [B, H_kv, S, D] where `keys` allows; [B, H, 1, D]. The query
    heads sharing a KV head read it together (enable_gqa)."""

    def hide(score, b, h, q_idx, kv_idx):
        allowed = keys.visible[b, kv_idx] & (kv_idx <= keys.cursor)
        return torch.where(allowed, score, -float("inf"))

    return flex_attention(q, k, v, score_mod=hide, scale=scale, enable_gqa=True)


def _layer(h, w: tuple, cache_k, cache_v, cos, sin, rows, mask, s: Shape) -> torch.Tensor:
    ln1, qkv_w, o_w, ln2, gate_up_w, down_w = w
    batch, t, _ = h.shape
    dim, nq, nkv = s.head_dim, s.heads * s.head_dim, s.kv_heads * s.head_dim
    one = s.small and batch * t == 1  # a decode step at batch 1 (a prompt pass has t > 1)
    qkv = _norm_linear(h, ln1, qkv_w, s.eps, one)
    q, k, v = qkv.split([nq, nkv, nkv], dim=-1)
    q = q.view(batch, t, s.heads, dim).transpose(1, 2)
    k = k.view(batch, t, s.kv_heads, dim).transpose(1, 2)
    v = v.view(batch, t, s.kv_heads, dim).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    att = _attend(q, k, v, cache_k, cache_v, rows, mask, s)
    if one:
        h = decode_kernels.gemv(att, o_w, residual=h).view(h.shape)
        act = decode_kernels.gemv(h, gate_up_w, norm=ln2, eps=s.eps, swiglu=True)
        return decode_kernels.gemv(act, down_w, residual=h).view(h.shape)
    h = h + F.linear(att, o_w)
    gate, up = _norm_linear(h, ln2, gate_up_w, s.eps, one).split([s.inter, s.inter], dim=-1)
    return h + F.linear(F.silu(gate) * up, down_w)


def _norm_linear(h, norm_w, w, eps: float, one: bool) -> torch.Tensor:
    """The product of the RMSNorm of h with W: [..., N] (one: one row through a GEMV)."""
    if one:
        return decode_kernels.gemv(h, w, norm=norm_w, eps=eps).view(*h.shape[:-1], -1)
    return F.linear(rms_norm(h, norm_w, eps), w)


def forward(weights: dict, s: Shape, cache: tuple, ids, positions, rows, mask, tables):
    """float32 logits [B, V] of the last position, writing each layer's keys and values.

    ids, positions [B, T]; rows [T]: the cache rows they go to; cache (keys, values):
    new_cache's; mask bool, [B, 1, T, T] for a prompt, [B, 1, 1, S] for one token
    (True: may attend), or for one token under flex attention its Keys; tables:
    rotary_tables' (cos, sin)."""
    cos, sin = (x[positions].unsqueeze(1) for x in tables)  # [B, 1, T, D]
    h = F.embedding(ids, weights["embed"])
    for i, w in enumerate(weights["layers"]):
        h = _layer(h, w, cache[0][i], cache[1][i], cos, sin, rows, mask, s)
    one = s.small and h.shape[0] * h.shape[1] == 1
    return _norm_linear(h[:, -1], weights["norm"], weights["lm_head"], s.eps, one).float()


def new_cache(model, s: Shape, batch: int, length: int) -> tuple[list, list]:
    """Keys and values: per layer one [B, H_kv, length, D] tensor. Not views of one
    [layers, ...] tensor: a compiled step that writes into a view of an input has the write
    functionalised into a copy of the whole input (seen in inductor's output code: the whole
    cache copied at every step); a write into an input itself is done in place."""
    size = (batch, s.kv_heads, length, s.head_dim)
    layers = model.config.num_hidden_layers
    new = dict(dtype=model.dtype, device=model.device)
    return tuple([torch.zeros(size, **new) for _ in range(layers)] for _ in range(2))
