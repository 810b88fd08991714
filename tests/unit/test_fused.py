"""arenaflow.fused: the compiled norm and SwiGLU compute transformers' own forward and backward.

On CPU the graphs are traced with backend aot_eager (the same forward and backward graphs,
without generating kernels); on CUDA (marker gpu) with inductor, the backend training uses."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from arenaflow import fused

CASES = [("cpu", "aot_eager", torch.float32),
         pytest.param("cuda", "inductor", torch.bfloat16, marks=[pytest.mark.gpu, pytest.mark.skipif(
             not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def llama(device, dtype):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return LlamaForCausalLM(cfg).to(device, dtype)


def loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("device, backend, dtype", CASES)
def test_fused_model_computes_the_same_loss_and_gradients(device, backend, dtype):
    model = llama(device, dtype)
    ids = torch.randint(0, 96, (3, 11), device=device)
    lengths = (11, 7)  # the second length runs through the same dynamic-shape graph
    want = [loss_and_grads(model, ids[:, :n]) for n in lengths]
    assert fused.install(model, backend) == 2 * 2 + 1 + 2  # two norms and an MLP per layer, the final norm
    assert fused.install(model, backend) == 7  # idempotent
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-3)
    for n, (want_loss, want_grads) in zip(lengths, want):
        got_loss, got_grads = loss_and_grads(model, ids[:, :n])
        torch.testing.assert_close(got_loss, want_loss, **tol)
        for name in want_grads:
            torch.testing.assert_close(got_grads[name], want_grads[name], **tol, msg=name)


def test_other_formulas_are_left_alone():
    """Gemma's norm multiplies by 1 + weight: not Llama's formula, so not swapped."""
    from transformers import GemmaConfig, GemmaForCausalLM

    cfg = GemmaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="gelu_pytorch_tanh")
    assert fused.install(GemmaForCausalLM(cfg), "aot_eager") == 0
