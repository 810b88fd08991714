"""arenaflow.models loads a base as its transformers release's own code: no Hub kernels, which
transformers 5.25 turns on by default and swaps in again on every train()/eval()."""

from __future__ import annotations

import torch

from arenaflow import fused, models


def test_a_loaded_base_keeps_arenaflows_forwards_across_train_and_eval(repo_root):
    """The DPO reference runs in eval mode and no_grad, the policy's first step in train mode:
    with arenaflow's norms installed in between, both must run the same kernels, or the first
    step's log-ratios are not 0 (tests/unit/test_train_fidelity.py, bf16). Under transformers
    5.25 with the Hub's kernels on, train() put transformers' norm back."""
    model = models.load_base(repo_root / "models/tiny-arith", torch.device("cpu"))
    assert not getattr(model, "use_kernels", False)
    model = model.to(torch.bfloat16)
    assert fused.install_native_norms(model) > 0
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    model.train()
    norms = list(fused._llama_norms(model))
    assert all(n.__dict__["forward"].__func__ is fused._native_norm_forward for n in norms)
    torch.testing.assert_close(model(input_ids=ids).logits, ref, rtol=0, atol=0)
