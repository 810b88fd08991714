"""DeepSpeed ZeRO-1/2's gradient norm, from multi-tensor kernels.

The stage-1/2 optimizer of DeepSpeed 0.19 (get_grad_norm_direct) computes the norm it clips by
one gradient tensor at a time: a float32 copy and a norm each, two kernels per tensor, ~840 a step
for SmolLM2's 420 LoRA tensors, each launched by the host. A one-rank SmolLM2 LoRA step on an H200
is bound by its launches (docs/benchmark-log.md). torch._foreach_norm computes the same
per-tensor norms, in float32, in a few launches; the sum of their squares, the all-reduce over
ranks, the root and the inf/NaN mask stay DeepSpeed's. Only the order of float32 additions
differs.
"""

from __future__ import annotations

import types

import torch


def sum_of_squares(grads: list[torch.Tensor]) -> torch.Tensor:
    """The squared L2 norm of `grads` taken together, in float32 (a 0-d tensor)."""
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    norms = torch._foreach_norm(grads, 2.0, dtype=torch.float32)
    return torch.stack(norms).pow(2.0).sum()


def _grad_norm_direct(self, gradients, params, norm_type=2):
    """DeepSpeedZeroOptimizer.get_grad_norm_direct for the L2 norm without model or pipeline
    parallelism; anything else goes to DeepSpeed's own."""
    from deepspeed import comm as dist
    from deepspeed.runtime.constants import PIPE_REPLICATED
    from deepspeed.runtime.utils import mask_nan_or_inf_with_val_inplace

    if (
        float(norm_type) != 2.0
        or self.model_parallel_rank != 0
        or any(getattr(p, PIPE_REPLICATED, False) for p in params)
    ):
        return type(self).get_grad_norm_direct(self, gradients, params, norm_type)
    grads = [g.detach() for g in gradients if not getattr(g, "_zero_padding", False)]
    total = sum_of_squares(grads).to(self.device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.dp_process_group)
    self._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
    total = total.pow(0.5)
    mask_nan_or_inf_with_val_inplace(total, device=self.device)
    return total


def install(optimizer) -> bool:
    """Route a ZeRO-1/2 optimizer's gradient norm through _grad_norm_direct; whether it was one
    (ZeRO-3's optimizer, another class, is left as it is)."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if not isinstance(optimizer, DeepSpeedZeroOptimizer):
        return False
    optimizer.get_grad_norm_direct = types.MethodType(_grad_norm_direct, optimizer)
    return True
