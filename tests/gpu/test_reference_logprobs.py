"""DPO's reference log-probs with the model on a GPU (the loop loads the policy onto CUDA
before DeepSpeed wraps it, while collated batches are built on the host).

Needs one CUDA GPU; skipped elsewhere (CI has none)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arenaflow import models, schema
from arenaflow.train import setup

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _pairs(vocab: int, n: int) -> dict:
    g = torch.Generator().manual_seed(0)

    def row(length: int):
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        return ids, [0] * (length // 2) + [1] * (length - length // 2)

    return {side: [row(8 + 3 * i) for i in range(n)] for side in ("chosen", "rejected")}


class Engine(torch.nn.Module):
    """What the reference reads of DeepSpeed's engine: the model's forward and its device."""

    def __init__(self, model):
        super().__init__()
        self.module = model

    @property
    def device(self):
        return next(self.module.parameters()).device

    def forward(self, **batch):
        return self.module(**batch)


def reference(model, pairs: dict) -> dict:
    """setup.reference_logprobs of `pairs` on one rank, as a DPO job's set-up computes them."""
    hyper = {**schema.hyper_defaults(), "seq_len": 64, "micro_batch_size": 4}
    hyper.update(seed=0, grad_accum=1)
    run = setup.Run(args=None, hyper=hyper, cuda=False, rank=0, world=1, corpus=pairs)
    run.engine = Engine(model)
    return setup.reference_logprobs(run)


def test_reference_logprobs_on_cuda_match_cpu():
    base = str(Path(__file__).resolve().parents[2] / "models/tiny-arith")
    pairs = _pairs(models.load_tokenizer(base).vocab_size, 10)
    # the same float32 weights on both devices (load_base on CUDA loads bf16: the H200 run of
    # this test compared two different models, 0.2 % apart)
    model = models.load_base(base, torch.device("cpu")).float().eval()
    on = {"cpu": reference(model, pairs)}
    on["cuda"] = reference(model.cuda(), pairs)
    for side in ("chosen", "rejected"):
        assert on["cuda"][side].device.type == "cpu"  # the loop moves each micro-batch's share
        torch.testing.assert_close(on["cuda"][side], on["cpu"][side], rtol=2e-3, atol=2e-2)
