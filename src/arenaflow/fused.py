"""Llama-family RMSNorm and SwiGLU as compiled (fused) kernels on CUDA.

transformers runs RMSNorm as a chain of elementwise kernels through float32 copies (cast, pow,
mean, rsqrt, multiply, cast back, multiply by the weight) and SwiGLU as silu then multiply:
in a LoRA step of a 1.2 B model at 16 x 2048 tokens on an H200 such chains took about half the
GPU time, and a decode step at batch 1 is ~1,200 small kernels (BENCHMARKS.md). torch.compile
fuses each chain into one kernel, forward and backward, with the same formula.

`install` swaps the forward of the norm and MLP modules of classes whose formula is known to be
Llama's, instance by instance; the modules keep their parameters, hooks (ZeRO-3's too) and
state dict. Other classes (e.g. Gemma's 1 + weight norm) are left as they are.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F

# Compiling costs ~7 s with a cold cache and 2-3 s with a warm one, and saves 0.14 s of a 0.42 s
# SmolLM2-135M LoRA step of 41k tokens on an H200 (BENCHMARKS.md, "One step in isolation"): it
# pays back after ~20-50 steps, and a run of a few steps spends most of its GPU time idle
# while inductor compiles.
AUTO_MIN_STEPS = 32

NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm"}
MLPS = {"LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP"}


def wanted(setting: bool | str, steps: int) -> bool:
    """Whether a training of `steps` optimizer steps compiles the fused kernels: `true`,
    `false`, or under `auto` when the steps pay the compile back."""
    if setting == "auto":
        return steps >= AUTO_MIN_STEPS
    return bool(setting)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward, as a function."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@functools.cache
def _compiled(backend: str) -> tuple:
    # dynamic: micro-batches and decode batches vary in length; one kernel serves them all
    return tuple(torch.compile(f, backend=backend, dynamic=True) for f in (rms_norm, silu_mul))


def _norm_forward(self, hidden_states):
    return self._arenaflow_rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self, x):
    return self.down_proj(self._arenaflow_silu_mul(self.gate_proj(x), self.up_proj(x)))


def _native_norm_forward(self, hidden_states):
    if hidden_states.dtype != self.weight.dtype:  # transformers promotes; torch.rms_norm does not
        return type(self).forward(self, hidden_states)
    return torch.rms_norm(hidden_states, self.weight.shape, self.weight, self.variance_epsilon)


def _llama_norms(model):
    for module in model.modules():
        if type(module).__name__ in NORMS and hasattr(module, "variance_epsilon"):
            yield module


def install_native_norms(model) -> int:
    """Routes the Llama-formula norms of `model` through torch.rms_norm; how many. On CUDA that is
    PyTorch's own fused kernel, one launch forward and one backward, nothing compiled; transformers
    launches ~7 and ~10. It multiplies by the weight in float32 and rounds once, where
    transformers rounds x * rsqrt(mean(x^2) + eps) to the input's dtype first: in bfloat16 the
    two differ by a rounding, as the compiled kernels do. Idempotent."""
    n = 0
    for module in _llama_norms(model):
        module.forward = types.MethodType(_native_norm_forward, module)
        n += 1
    return n


def install(model, backend: str = "inductor") -> int:
    """Routes the Llama-formula norms and SwiGLU MLPs of `model` through compiled kernels; how
    many modules. Idempotent. `backend` "aot_eager" traces the same graphs without generating
    kernels (the CPU tests use it)."""
    norm, mul = _compiled(backend)
    n = 0
    for module in _llama_norms(model):
        module._arenaflow_rms_norm = norm
        module.forward = types.MethodType(_norm_forward, module)
        n += 1
    for module in model.modules():
        if type(module).__name__ in MLPS and getattr(module.config, "hidden_act", None) in (
            "silu",
            "swish",
        ):
            module._arenaflow_silu_mul = mul
            module.forward = types.MethodType(_mlp_forward, module)
            n += 1
    return n
