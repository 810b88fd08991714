"""arenaflow.train.speed.rope: the rotary embedding as one autograd node computes transformers'
losses
and gradients bitwise, replaces only a function that computes Llama's formula, and records one
node where transformers records fourteen."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from devices import CPU_AND_CUDA
from peft import LoraConfig, get_peft_model
from test_fused import TINY
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from arenaflow.train.speed import lora_fused, rope

LORA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture
def restore_modules(monkeypatch):
    """transformers' own function in the modules, whatever ran before in this process, and the
    modules as they were after the test."""
    for name in ("llama", "qwen2"):
        module = sys.modules[f"transformers.models.{name}.modeling_{name}"]
        own = getattr(module, "transformers_apply_rotary_pos_emb", module.apply_rotary_pos_emb)
        monkeypatch.setattr(module, "apply_rotary_pos_emb", own)


def model(family, device, dtype):
    torch.manual_seed(0)
    net = (
        LlamaForCausalLM(LlamaConfig(**TINY))
        if family == "llama"
        else Qwen2ForCausalLM(Qwen2Config(**TINY))
    )
    net = get_peft_model(net, LoraConfig(r=4, lora_alpha=8, target_modules=LORA))
    for name, p in net.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero; a non-zero B sends gradient through A
            torch.nn.init.normal_(p, std=0.1)
    net = net.to(device, dtype)
    lora_fused.fuse(net)  # as a training runs it
    return net


def loss_and_grads(net, ids):
    net.zero_grad()
    loss = net(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.requires_grad}
    return loss.detach(), grads, loss.grad_fn


def count_nodes(fn) -> int:
    seen, stack = set(), [fn]
    while stack:
        f = stack.pop()
        if f is not None and f not in seen:
            seen.add(f)
            stack.extend(n for n, _ in f.next_functions)
    return len(seen)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_losses_and_gradients_are_transformers_own_bitwise(device, family, dtype, restore_modules):
    net = model(family, device, dtype)
    ids = torch.randint(0, 96, (3, 13), device=device, generator=None)
    plain_loss, plain_grads, plain_fn = loss_and_grads(net, ids)
    assert rope.install(net) == 1
    loss, grads, fn = loss_and_grads(net, ids)
    assert torch.equal(loss, plain_loss)
    assert grads.keys() == plain_grads.keys() and len(grads) == 2 * 2 * len(LORA)
    for name in grads:
        assert torch.equal(grads[name], plain_grads[name]), name
    # transformers: 7 nodes for each of q and k, a layer; here 1 for both
    assert count_nodes(plain_fn) - count_nodes(fn) == 2 * (2 * 7 - 1)


def test_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(0)
    f64 = dict(dtype=torch.float64, generator=g)
    q = torch.randn(2, 4, 5, 6, **f64).requires_grad_()
    k = torch.randn(2, 2, 5, 6, **f64).requires_grad_()
    cos, sin = torch.randn(2, 1, 5, 6, **f64), torch.randn(2, 1, 5, 6, **f64)
    assert torch.autograd.gradcheck(rope.RotaryFunction.apply, (q, k, cos, sin))


def test_install_is_idempotent_and_leaves_another_formula(monkeypatch, restore_modules):
    net = model("llama", "cpu", torch.float32)
    assert rope.install(net) == rope.install(net) == 1

    # a family whose rotary differs (here interleaved pairs): its function stays
    def interleaved(q, k, cos, sin, unsqueeze_dim=1):
        def rot(x):
            return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

        c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * c + rot(q) * s, k * c + rot(k) * s

    other = types.ModuleType("other_family")
    other.apply_rotary_pos_emb = interleaved
    other.OtherAttention = type(
        "OtherAttention", (torch.nn.Module,), {"__module__": "other_family"}
    )
    monkeypatch.setitem(sys.modules, "other_family", other)
    holder = torch.nn.Module()
    holder.attn = other.OtherAttention()
    assert rope.install(holder) == 0
    assert other.apply_rotary_pos_emb is interleaved


def test_without_gradients_it_records_nothing(restore_modules):
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 1, 3, 4)
    cos, sin = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    with torch.no_grad():
        a, b = rope.apply_rotary_pos_emb(q.requires_grad_(), k, cos, sin)
    assert a.grad_fn is None and b.grad_fn is None
