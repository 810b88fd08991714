"""DPO's reference log-probs with the model on a GPU (the loop loads the policy onto CUDA
before DeepSpeed wraps it, while collated batches are built on the host).

Needs one CUDA GPU; skipped elsewhere (CI has none)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arenaflow import models
from arenaflow.train import loop

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


def test_reference_logprobs_on_cuda_match_cpu():
    base = str(Path(__file__).resolve().parents[2] / "models/tiny-arith")
    pairs = _pairs(models.load_tokenizer(base).vocab_size, 10)
    hyper = {"seq_len": 64, "micro_batch_size": 4}
    # the same float32 weights on both devices (load_base on CUDA loads bf16: the H200 run of
    # this test compared two different models, 0.2 % apart)
    model = models.load_base(base, torch.device("cpu")).float().eval()
    on = {"cpu": loop.reference_logprobs(model, pairs, hyper, pad_id=0)}
    on["cuda"] = loop.reference_logprobs(model.cuda(), pairs, hyper, pad_id=0)
    for side in ("chosen", "rejected"):
        assert on["cuda"][side].device.type == "cpu"  # the loop moves each micro-batch's share
        torch.testing.assert_close(on["cuda"][side], on["cpu"][side], rtol=2e-3, atol=2e-2)
