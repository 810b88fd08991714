"""train/lora_grouped computes a layer's q/k/v and gate/up LoRA linears as one function each: the
same loss and gradients as each through lora_fused alone, to float64's rounding (the order of
the sums differs, so not bit for bit), nothing held once a layer's members took their outputs,
and each member alone wherever the group's conditions fail."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from test_fused import TINY
from transformers import LlamaConfig, LlamaForCausalLM

from arenaflow.train.speed import lora_fused, lora_grouped

PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model(dtype, grouped: bool, targets=PROJECTIONS, n_groups: int = 2, **lora):
    torch.manual_seed(0)
    net = LlamaForCausalLM(LlamaConfig(**TINY))
    config = LoraConfig(r=8, lora_alpha=16, target_modules=targets, **lora)
    net = get_peft_model(net, config).to(dtype)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a fresh lora_B is zeros, which would hide half the products
        for p in net.parameters():
            if p.requires_grad:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    lora_fused.fuse(net)
    if grouped:
        assert lora_grouped.group(net) == n_groups * TINY["num_hidden_layers"]
    return net


def nodes(loss) -> dict[str, int]:
    """The autograd graph's nodes below `loss`, by name."""
    seen, todo, count = set(), [loss.grad_fn], {}
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        count[fn.name()] = count.get(fn.name(), 0) + 1
        todo.extend(f for f, _ in fn.next_functions)
    return count


def loss_and_grads(net, graph: dict | None = None):
    ids = torch.randint(0, TINY["vocab_size"], (3, 11), generator=torch.Generator().manual_seed(2))
    loss = net(input_ids=ids, labels=ids, use_cache=False).loss
    if graph is not None:
        graph.update(nodes(loss))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in net.named_parameters() if p.requires_grad}


def groups(net):
    return {m.arenaflow_lora_group for m in net.modules() if hasattr(m, "arenaflow_lora_group")}


def test_a_grouped_step_is_the_ungrouped_one_to_float64_rounding():
    want_loss, want = loss_and_grads(model(torch.float64, grouped=False))
    net, graph = model(torch.float64, grouped=True), {}
    loss, got = loss_and_grads(net, graph)
    layers = TINY["num_hidden_layers"]  # one node for q/k/v and one for gate/up, a layer
    assert graph["LoraGroupFunctionBackward"] == 2 * layers
    assert graph["LoraLinearFunctionBackward"] == 2 * layers  # o_proj and down_proj alone
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=0)
    assert got.keys() == want.keys() and len(got) == 7 * 2 * TINY["num_hidden_layers"]
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-10, atol=1e-13, msg=name)
    # every member took its output: no layer's activations are kept past its forward
    assert all(g.x is None and not g.pending for g in groups(net))


def test_bfloat16_agrees_to_its_rounding():
    want_loss, want = loss_and_grads(model(torch.bfloat16, grouped=False))
    loss, got = loss_and_grads(model(torch.bfloat16, grouped=True))
    torch.testing.assert_close(loss, want_loss, rtol=2e-2, atol=0)
    for name in want:
        scale = want[name].abs().max()
        assert (got[name] - want[name]).abs().max() <= 0.05 * scale, name


def test_the_function_passes_gradcheck():
    g = torch.Generator().manual_seed(3)

    def t(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_()

    x = t(2, 3, 6)
    ws, lora_as, lora_bs = [t(5, 6), t(4, 6)], [t(2, 6), t(3, 6)], [t(5, 2), t(4, 3)]
    for w in ws:
        w.requires_grad_(False)  # the base stays frozen, as in training
    assert torch.autograd.gradcheck(
        lambda x, *ab: lora_grouped.LoraGroupFunction.apply(x, 0.5, 2, *ws, *ab),
        (x, *lora_as, *lora_bs),
    )


@pytest.mark.parametrize(
    "lora",
    [{"alpha_pattern": {"k_proj": 32}}, {"lora_dropout": 0.1}],
    ids=["another-scaling", "dropout"],
)
def test_members_go_alone_where_the_group_does_not_fit(lora):
    net = model(torch.float64, grouped=True, **lora)
    net.eval()  # dropout off: both ways then compute the same
    want = model(torch.float64, grouped=False, **lora).eval()
    ids = torch.arange(10).reshape(1, 10)
    torch.testing.assert_close(net(input_ids=ids).logits, want(input_ids=ids).logits)
    assert all(g.x is None and not g.pending for g in groups(net))


def test_two_members_of_a_group_group_and_one_goes_alone():
    """An adapter on q, v and up only (the reference lineages' tiny arms): q and v form a group,
    up_proj, alone of its group, keeps lora_fused's function; the step is the ungrouped one."""
    targets = ["q_proj", "v_proj", "up_proj"]
    want_loss, want = loss_and_grads(model(torch.float64, grouped=False, targets=targets))
    net = model(torch.float64, grouped=True, targets=targets, n_groups=1)
    assert not hasattr(net.base_model.model.model.layers[0].mlp.up_proj, "arenaflow_lora_group")
    loss, got = loss_and_grads(net)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=0)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-12)
