"""Rotary position embedding for a training step as one autograd node, bitwise transformers'.

transformers' apply_rotary_pos_emb runs, for q and for k, x * cos + rotate_half(x) * sin with
rotate_half(x) = cat(-x2, x1): per tensor five kernels and seven autograd nodes forward, and a
backward of nine kernels (two products, a negation, each half's slice made whole by a zeroed
tensor and a copy, two adds gathering x's three gradients). In a one-rank LoRA step of
SmolLM2-135M (30 layers) that is 840 of its ~4,990 kernels on an H200 and 420 of its 1,899
autograd nodes (counted on CPU, where torch.rms_norm adds nodes of its own), each launched or
walked by the host one by one, and the step is host-bound (BENCHMARKS.md).

RotaryFunction computes the same forward with the same kernels, and the gradient directly:
rotate_half is a rotation, its transpose is -rotate_half, so x's gradient is
g * cos + cat((g * sin)2, -(g * sin)1): five kernels per tensor backward, one node for q and k
together (600 kernels and 30 nodes a step where there were 840 and 420; measured on an H200 at
R220's shape, 4,987 -> 4,717 kernels a step).
Every operation rounds where transformers' does (the two halves of the rotated gradient fall in
disjoint halves, so transformers' adds of them are exact), so losses and gradients are bitwise
equal (tests/unit/test_rope.py).

`install` replaces the function in the modeling modules of a model's attention classes, where
a check on random tensors finds it computes exactly transformers' Llama formula (a partial or
interleaved rotary, as some families have, keeps its own, and so does a model that rotates only
part of each head). The replacement is process-wide, as
the function is a module global: a training job's process trains one model.
"""

from __future__ import annotations

import sys

import torch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate(x, cos, sin):
    return (x * cos) + (_rotate_half(x) * sin)


def _unrotate(g, cos, sin):
    """The gradient at x of _rotate(x, cos, sin), given the gradient g at its output."""
    gs = g * sin
    half = g.shape[-1] // 2
    return (g * cos) + torch.cat((gs[..., half:], -gs[..., :half]), dim=-1)


class RotaryFunction(torch.autograd.Function):
    """(q, k, cos, sin) -> (q * cos + rotate_half(q) * sin, the same for k); cos and sin
    already broadcastable to q and k, and constant."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    @staticmethod
    def backward(ctx, grad_q, grad_k):
        cos, sin = ctx.saved_tensors
        need = ctx.needs_input_grad
        gq = _unrotate(grad_q, cos, sin) if need[0] and grad_q is not None else None
        gk = _unrotate(grad_k, cos, sin) if need[1] and grad_k is not None else None
        return gq, gk, None, None


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' apply_rotary_pos_emb (same signature and result), one node where autograd
    records it."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    if cos.requires_grad or sin.requires_grad or not torch.is_grad_enabled():
        return _rotate(q, cos, sin), _rotate(k, cos, sin)
    return RotaryFunction.apply(q, k, cos, sin)


def _computes_llama_rope(fn) -> bool:
    """Whether `fn` returns what transformers' Llama formula does, bitwise, on random tensors."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 1, 5, 8, generator=g)
    cos, sin = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    try:
        with torch.no_grad():
            got = fn(q, k, cos, sin)
    except Exception:  # another signature: not the function this replaces
        return False
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    want = (_rotate(q, c, s), _rotate(k, c, s))
    return all(torch.equal(a, b) for a, b in zip(got, want))


def install(model) -> int:
    """Routes the rotary embedding of `model`'s attention modules through RotaryFunction; how
    many modeling modules it replaced the function in (those already replaced count).
    Idempotent. None where the model rotates only part of each head (models.partial_rotary):
    the check on random tensors cannot tell a partial function from Llama's, as it rotates all
    of a head whose width equals its table's, but the model's heads are wider than its table."""
    from arenaflow import models

    if models.partial_rotary(model):
        return 0
    n = 0
    for name in {
        type(m).__module__ for m in model.modules() if type(m).__name__.endswith("Attention")
    }:
        module = sys.modules.get(name)
        fn = getattr(module, "apply_rotary_pos_emb", None)
        if fn is apply_rotary_pos_emb:
            n += 1
        elif fn is not None and _computes_llama_rope(fn):
            module.transformers_apply_rotary_pos_emb = fn  # what it replaced, for tests and A/Bs
            module.apply_rotary_pos_emb = apply_rotary_pos_emb
            n += 1
    return n
