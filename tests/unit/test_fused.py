"""arenaflow.fused: the compiled norm and SwiGLU compute transformers' own forward and backward.

On CPU the graphs are traced with backend aot_eager (the same forward and backward graphs,
without generating kernels); on CUDA (marker gpu) with inductor, the backend training uses."""

from __future__ import annotations

import pytest
import torch
from devices import CPU_AND_CUDA
from transformers import LlamaConfig, LlamaForCausalLM

from arenaflow import fused

CASES = [
    ("cpu", "aot_eager"),
    pytest.param(
        "cuda",
        "inductor",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]


# a Llama-family shape small enough for CPU, with grouped-query attention (test_rope's too)
TINY = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def llama(device, dtype):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY)).to(device, dtype)


def loss_and_grads(model, ids):
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


def assert_like_transformers(got, plain, true) -> None:
    """`got` = (loss, grads) of a model whose modules were swapped, `plain` the same model's
    before the swap. float32 (`true` None): `got` equals `plain` to 1e-5. bfloat16 (`true` the
    float32 model's): `got` is no farther from `true` than `plain` is (twice, plus 0.1 %)."""
    (loss, grads), (plain_loss, plain_grads) = got, plain
    assert grads.keys() == plain_grads.keys()
    if true is None:
        torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-6)
        for name in grads:
            torch.testing.assert_close(
                grads[name], plain_grads[name], rtol=1e-5, atol=1e-6, msg=name
            )
        return
    true_loss, true_grads = true
    assert abs(loss - true_loss) <= 2 * abs(plain_loss - true_loss) + 1e-3 * abs(true_loss)
    for name in grads:
        err, plain_err = ((g - true_grads[name]).norm() for g in (grads[name], plain_grads[name]))
        assert err <= 2 * plain_err + 1e-3 * true_grads[name].norm(), (name, err, plain_err)


@pytest.mark.parametrize("device, backend", CASES)
def test_fused_model_computes_the_same_loss_and_gradients(device, backend):
    """float32: equal to 1e-5. bfloat16 (the GPU case): fused kernels round once where
    transformers rounds after each op, so the oracle is float32, and the fused model must be no
    farther from it than transformers' own bfloat16 forward is."""
    ids = torch.randint(0, 96, (3, 11), device=device)
    lengths = (11, 7)  # the second length runs through the same dynamic-shape graph
    truth = [loss_and_grads(llama(device, torch.float32), ids[:, :n]) for n in lengths]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = llama(device, dtype)
    plain = [loss_and_grads(model, ids[:, :n]) for n in lengths]
    assert (
        fused.install(model, backend) == 2 * 2 + 1 + 2
    )  # two norms and an MLP per layer, the final norm
    assert fused.install(model, backend) == 7  # idempotent
    for n, true, before in zip(lengths, truth, plain):
        got = loss_and_grads(model, ids[:, :n])
        assert_like_transformers(got, before, None if dtype == torch.float32 else true)


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_native_norms_compute_transformers_loss_and_gradients(device):
    """torch.rms_norm in place of LlamaRMSNorm: float32 equal to 1e-5; bfloat16 no farther from
    the float32 model than transformers' own bfloat16 forward (one rounding fewer, not more)."""
    ids = torch.randint(0, 96, (3, 11), device=device)
    true = loss_and_grads(llama(device, torch.float32), ids)
    for dtype in (torch.float32, torch.bfloat16):
        model = llama(device, dtype)
        before = loss_and_grads(model, ids)
        assert fused.install_native_norms(model) == 2 * 2 + 1  # two a layer and the final one
        assert fused.install_native_norms(model) == 5  # idempotent
        got = loss_and_grads(model, ids)
        assert_like_transformers(got, before, None if dtype == torch.float32 else true)


def test_native_norms_keep_transformers_promotion_for_mixed_dtypes():
    """A float32 weight under bfloat16 activations: transformers promotes the output to float32;
    torch.rms_norm wants one dtype, so such a norm keeps transformers' forward."""
    model = llama("cpu", torch.float32)
    fused.install_native_norms(model)
    norm = model.model.norm
    x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
    assert norm(x).dtype == torch.float32


def test_other_formulas_are_left_alone():
    """Gemma's norm multiplies by 1 + weight: not Llama's formula, so not swapped."""
    from transformers import GemmaConfig, GemmaForCausalLM

    cfg = GemmaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="gelu_pytorch_tanh",
    )
    assert fused.install(GemmaForCausalLM(cfg), "aot_eager") == 0
    assert fused.install_native_norms(GemmaForCausalLM(cfg)) == 0
