"""A PEFT LoRA Linear as one autograd function, its adds folded into the matrix products.

PEFT computes base(x) + lora_B(lora_A(dropout(x))) * scaling. At 16 rows x 2048 tokens the
scaling multiply and the add (forward), the multiply again and the sum of x's two gradients
(backward) each pass over a [tokens, out] or [tokens, in] activation; on an H200 these passes
cost about a sixth of a LoRA step of a 1.2 B model (BENCHMARKS.md). Here the scaling is the
alpha of the products that read the rank-r factor, and both sums happen inside the matrix
products (addmm with beta 1): the same arithmetic and gradients, four activation passes fewer
per adapted Linear.

The function reads the base, lora_A and lora_B weights without calling those modules, so it is
used only where ZeRO-3 gathers a whole transformer block on entry (zero3_leaf_modules): with
hooks on every submodule the weights would not be gathered.
"""

from __future__ import annotations

import types

import torch
from torch import nn


class LoraLinearFunction(torch.autograd.Function):
    """y = x W^T + b + s (x A^T) B^T, for x [..., in], W [out, in], A [r, in], B [out, r]. The
    scaling s rides in the products' alpha (applied to their float32 sums) rather than in a
    multiply of its own: two kernel launches fewer per adapted Linear and step, which a host-bound
    step of a small model feels (docs/benchmark-log.md)."""

    @staticmethod
    def forward(ctx, x, weight, bias, lora_a, lora_b, scaling: float):
        x2 = x.reshape(-1, x.shape[-1])
        h = x2 @ lora_a.t()  # [tokens, r], unscaled
        y = x2 @ weight.t() if bias is None else torch.addmm(bias, x2, weight.t())
        y.addmm_(h, lora_b.t(), alpha=scaling)
        ctx.save_for_backward(x2, weight, lora_a, lora_b, h)
        ctx.scaling, ctx.has_bias = scaling, bias is not None
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        x2, weight, lora_a, lora_b, h = ctx.saved_tensors
        s = ctx.scaling
        g = grad.reshape(-1, grad.shape[-1])
        gh = g @ lora_b  # [tokens, r]: the gradient at the rank-r product, over s
        need = ctx.needs_input_grad
        grad_x = (
            (g @ weight).addmm_(gh, lora_a, alpha=s).view(*grad.shape[:-1], x2.shape[-1])
            if need[0]
            else None
        )
        # beta 0: the input is ignored (an uninitialised 0-d tensor, no kernel to fill it)
        none = x2.new_empty(())
        grad_w = g.t() @ x2 if need[1] else None
        grad_bias = g.sum(0) if ctx.has_bias and need[2] else None
        grad_a = torch.addmm(none, gh.t(), x2, beta=0, alpha=s) if need[3] else None
        grad_b = torch.addmm(none, g.t(), h, beta=0, alpha=s) if need[4] else None
        return grad_x, grad_w, grad_bias, grad_a, grad_b, None


def fusable(self, x) -> bool:
    """Whether PEFT's lora.Linear `self` computes nothing on `x` that LoraLinearFunction leaves
    out: one active adapter, plain (no DoRA or other variant, no dropout, no B bias), unmerged,
    on a plain Linear, in the input's dtype."""
    name = self.active_adapters[0] if len(self.active_adapters) == 1 else None
    return not (
        self.disable_adapters
        or self.merged
        or name not in self.lora_A
        or name in self.lora_variant  # DoRA and other variants
        or not isinstance(self.base_layer, nn.Linear)
        or getattr(self, "fan_in_fan_out", False)
        or not isinstance(self.lora_dropout[name], nn.Identity)
        or self.lora_B[name].bias is not None
        or x.dtype != self.lora_A[name].weight.dtype
    )


def _forward(self, x, *args, **kwargs):
    """PEFT lora.Linear.forward, through LoraLinearFunction when nothing needs PEFT's own path."""
    if args or kwargs or not fusable(self, x):
        return type(self).forward(self, x, *args, **kwargs)
    name = self.active_adapters[0]
    base = self.base_layer
    return LoraLinearFunction.apply(
        x,
        base.weight,
        base.bias,
        self.lora_A[name].weight,
        self.lora_B[name].weight,
        self.scaling[name],
    )


def fuse(model) -> int:
    """Routes every PEFT lora.Linear of `model` through LoraLinearFunction; how many."""
    from peft.tuners.lora import Linear

    n = 0
    for module in model.modules():
        if type(module) is Linear:  # not the quantised variants, which subclass it
            module.forward = types.MethodType(_forward, module)
            n += 1
    return n
