"""DeepSpeed ZeRO-1/2 on one rank: its gradient all-reduce is the identity, so it is skipped.

Without a contiguous gradient bucket (train/dist.deepspeed_config: one rank has none), the
stage-1/2 optimizer of DeepSpeed 0.19 reduces each bucket of gradients through
buffered_reduce_fallback: it flattens the bucket into a new tensor, divides it by the number of
ranks, all-reduces it, and copies each gradient back from the result, one copy per tensor (420
for SmolLM2's LoRA tensors: the "Memcpy DtoD" of a step's kernel list, BENCHMARKS.md). On one
rank the division is by 1.0 and the sum is over one rank, so every gradient gets its own values
back, bitwise: `install` leaves that out. Anything else (several ranks, sequence parallelism, the
float32 accumulation buffer's path, which adds into that buffer) keeps DeepSpeed's own.
"""

from __future__ import annotations

import types


def _reduce_nothing(self, rank, grads, communication_data_type, elements_per_buffer=0, log=None):
    """buffered_reduce_fallback on one rank: the gradients already hold their reduction."""


def install(optimizer) -> bool:
    """Skip a one-rank ZeRO-1/2 optimizer's identity all-reduce; whether it was one."""
    from deepspeed import comm as dist
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if not isinstance(optimizer, DeepSpeedZeroOptimizer):
        return False
    if (
        dist.get_world_size(group=optimizer.dp_process_group) != 1
        or getattr(optimizer, "sequence_parallel_size", 1) != 1
    ):
        return False
    optimizer.buffered_reduce_fallback = types.MethodType(_reduce_nothing, optimizer)
    return True
