"""DPO's reference log-probs (train.setup.reference_logprobs) as a job's set-up computes them:
batched, padded, in the first epoch's micro-batches, held to each row's own unpadded forward
pass. On CUDA too (the loop loads the policy onto the GPU before DeepSpeed wraps it, while
collated batches are built on the host): the gpu marker's case, skipped without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arenaflow import models, schema
from arenaflow.train import setup

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ],
)
BASE = Path(__file__).resolve().parents[2] / "models/tiny-arith"


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


def one_by_one(model, pairs: dict) -> dict:
    """The oracle: each row alone through the model, unpadded, its supervised tokens' log-probs
    summed (token t predicted from the logits at t - 1)."""
    out = {}
    with torch.no_grad():
        for side, rows in pairs.items():
            sums = []
            for ids, mask in rows:
                logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
                picked = logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
                sums.append(picked[torch.tensor(mask[1:]) == 1].sum())
            out[side] = torch.stack(sums)
    return out


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_reference_logprobs_match_each_rows_own_forward(device):
    pairs = _pairs(models.load_tokenizer(str(BASE)).vocab_size, 10)
    # the same float32 weights on both devices (load_base on CUDA loads bf16: the H200 run of
    # this test compared two different models, 0.2 % apart)
    model = models.load_base(str(BASE), torch.device("cpu")).float().eval()
    want = one_by_one(model, pairs)
    got = reference(model.to(device), pairs)
    for side in ("chosen", "rejected"):
        assert got[side].device.type == "cpu"  # the loop moves each micro-batch's share
        assert (got[side] < 0).all()  # every row has supervised tokens
        # CPU: padding and batching change the sums' rounding only; CUDA: TF32 products
        tol = dict(rtol=2e-3, atol=2e-2) if device == "cuda" else dict(rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(got[side], want[side], **tol)
