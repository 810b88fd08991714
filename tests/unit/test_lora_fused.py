"""LoRA linears as one autograd function (arenaflow.train.speed.lora_fused): gradients against
finite differences, and a fused PEFT model against PEFT's own forward and backward."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from arenaflow.train.speed.lora_fused import LoraLinearFunction, fuse


@pytest.mark.parametrize("bias", [False, True])
def test_gradients_match_finite_differences(bias):
    torch.manual_seed(0)
    f64 = dict(dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 3, 5, **f64)
    inputs = (
        x,
        torch.randn(4, 5, **f64),
        torch.randn(4, **f64) if bias else None,
        torch.randn(2, 5, **f64),
        torch.randn(4, 2, **f64),
        0.7,
    )
    assert torch.autograd.gradcheck(LoraLinearFunction.apply, inputs)


def peft_llama(dropout: float = 0.0):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = get_peft_model(
        LlamaForCausalLM(cfg),
        LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=dropout,
            target_modules=[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
        ),
    )
    for name, p in model.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero; a non-zero B tests every term
            torch.nn.init.normal_(p, std=0.1)
    return model


def loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {
        n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad
    }


def test_a_fused_peft_model_computes_peft_s_loss_and_gradients():
    ids = torch.randint(0, 96, (3, 10), generator=torch.Generator().manual_seed(1))
    model = peft_llama()
    want_loss, want = loss_and_grads(model, ids)
    assert fuse(model) == 2 * 7
    got_loss, got = loss_and_grads(model, ids)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-6)
    assert got.keys() == want.keys() and len(got) == 2 * 7 * 2
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("dropout, peft_path", [(0.0, False), (0.5, True)])
def test_layers_that_need_peft_s_own_path_keep_it(dropout, peft_path):
    """With dropout the LoRA input is not x: PEFT's forward (which calls lora_A) must run."""
    model = peft_llama(dropout)
    fuse(model)
    calls = []
    model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].register_forward_hook(
        lambda *a: calls.append(1)
    )
    model(input_ids=torch.zeros(1, 4, dtype=torch.long))
    assert bool(calls) == peft_path
