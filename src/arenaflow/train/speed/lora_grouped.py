"""PEFT LoRA linears that read the same input (q/k/v, gate/up) as one autograd function.

A Llama layer's q_proj, k_proj and v_proj all read the normed hidden state, and gate_proj and
up_proj the other one. Through lora_fused each is its own function: three rank-r products of the
same input forward, three x gradients summed by autograd backward, and three split-K products for
the A gradients, whose inner dimension is the step's tokens (each split-K product is a memset, a
product and a reduction on cuBLAS). Here the group's A matrices are one [sum r, in] matrix: one
product forward, one for the A gradients, and x's gradient is one chain of addmm. A SmolLM2 LoRA
step is bound by the host launching its kernels (docs/notes.md), and this launches ~13 fewer a
layer and runs 3 Python functions fewer a layer each way.

The arithmetic is the same but not in the same order, nor through the same cuBLAS kernels
(wider products), so results agree to rounding, not bit for bit (tests/unit/test_lora_grouped.py
holds them to float64's).

The members are called one by one by transformers; the first call of a group with an input
computes every member's output and the others take theirs when called with that same tensor.
Used only where train/lora_fused's own conditions hold for every member (one adapter, no
dropout, no bias, no DoRA, the input's dtype), with equal scalings; else each member goes
through lora_fused alone.
"""

from __future__ import annotations

import types

import torch

from arenaflow.train.speed import lora_fused

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class LoraGroupFunction(torch.autograd.Function):
    """ys[i] = x W_i^T + s (x A_i^T) B_i^T for x [..., in], W_i [out_i, in], A_i [r_i, in],
    B_i [out_i, r_i]; tensors = (*W, *A, *B)."""

    @staticmethod
    def forward(ctx, x, scaling: float, n: int, *tensors):
        ws, lora_as, lora_bs = tensors[:n], tensors[n : 2 * n], tensors[2 * n :]
        x2 = x.reshape(-1, x.shape[-1])
        a = torch.cat(lora_as)  # [sum r, in]
        h = x2 @ a.t()  # [tokens, sum r], unscaled
        ys, offset = [], 0
        for w, b in zip(ws, lora_bs):
            r = b.shape[1]
            y = x2 @ w.t()
            y.addmm_(h[:, offset : offset + r], b.t(), alpha=scaling)
            ys.append(y.view(*x.shape[:-1], y.shape[-1]))
            offset += r
        ctx.save_for_backward(x2, a, h, *ws, *lora_bs)
        ctx.scaling, ctx.n, ctx.x_shape = scaling, n, x.shape
        return tuple(ys)

    @staticmethod
    def backward(ctx, *grads):
        x2, a, h, *rest = ctx.saved_tensors
        n, s = ctx.n, ctx.scaling
        ws, lora_bs = rest[:n], rest[n:]
        gs = [
            (g if g is not None else x2.new_zeros(*ctx.x_shape[:-1], w.shape[0])).reshape(
                -1, w.shape[0]
            )
            for g, w in zip(grads, ws)
        ]
        ranks = [b.shape[1] for b in lora_bs]
        gh = torch.cat([g @ b for g, b in zip(gs, lora_bs)], dim=1)  # [tokens, sum r], over s
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = gs[0] @ ws[0]
            for g, w in zip(gs[1:], ws[1:]):
                grad_x.addmm_(g, w)
            grad_x = grad_x.addmm_(gh, a, alpha=s).view(ctx.x_shape)
        none = x2.new_empty(())  # beta 0: the input is ignored
        grad_a = torch.addmm(none, gh.t(), x2, beta=0, alpha=s).split(ranks)
        grad_b, offset = [], 0
        for g, r in zip(gs, ranks):
            grad_b.append(torch.addmm(none, g.t(), h[:, offset : offset + r], beta=0, alpha=s))
            offset += r
        return (grad_x, None, None, *([None] * n), *grad_a, *grad_b)


class Group:
    """Sibling LoRA linears of one parent that read the same input, and the outputs computed
    for the members not yet called."""

    def __init__(self, members: list):
        self.members = members
        self.x = None
        self.pending: dict = {}

    def take(self, member, x):
        """The output computed for `member` from `x` by a sibling's call, or None."""
        if self.x is x and member in self.pending:
            out = self.pending.pop(member)
            if not self.pending:  # all taken: drop the references (activations stay autograd's)
                self.x = None
            return out
        return None

    def run(self, caller, x):
        """Every member's output from `x` in one function; the caller's, the rest held."""
        mods = self.members
        name = mods[0].active_adapters[0]
        tensors = [m.base_layer.weight for m in mods]
        tensors += [m.lora_A[name].weight for m in mods] + [m.lora_B[name].weight for m in mods]
        outs = LoraGroupFunction.apply(x, mods[0].scaling[name], len(mods), *tensors)
        self.x, self.pending = x, {m: o for m, o in zip(mods, outs) if m is not caller}
        return outs[mods.index(caller)]

    def fits(self, x) -> bool:
        """lora_fused's own conditions for every member, one scaling and in-features."""
        names = {tuple(m.active_adapters) for m in self.members}
        if len(names) != 1 or len(next(iter(names))) != 1:
            return False
        name = next(iter(names))[0]
        if len({m.scaling.get(name) for m in self.members}) != 1:
            return False
        return all(lora_fused.fusable(m, x) and m.base_layer.bias is None for m in self.members)


def _forward(self, x, *args, **kwargs):
    group = self.arenaflow_lora_group
    out = group.take(self, x)
    if out is not None:
        return out
    if args or kwargs or not group.fits(x):
        return lora_fused._forward(self, x, *args, **kwargs)
    return group.run(self, x)


def group(model) -> int:
    """Routes each parent's q/k/v and gate/up PEFT lora.Linear siblings (two or more of a
    group: an adapter on q and v alone groups those two) through one LoraGroupFunction (the
    rest keep their own forward); how many groups."""
    from peft.tuners.lora import Linear

    n = 0
    for parent in model.modules():
        for names in GROUPS:
            mods = [m for m in (getattr(parent, k, None) for k in names) if type(m) is Linear]
            if len(mods) >= 2:
                g = Group(mods)
                for m in mods:
                    m.arenaflow_lora_group = g
                    m.forward = types.MethodType(_forward, m)
                n += 1
    return n
