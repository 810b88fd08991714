"""Training objectives: SFT (assistant-only NLL), DPO with an NLL term, SimPO.

Every function returns a *sum* over the micro-batch; the caller divides by the global count,
so the objective does not depend on how a global batch is split into micro-batches or ranks.

- DPO (Rafailov et al. 2023): -log sigmoid(beta * ((c - c_ref) - (r - r_ref))), plus
  nll_weight * (per-token NLL of the chosen response) as in lineage 002
  (docs/lineages.md#002-sft-dpo-and-if-repair).
- SimPO (Meng et al. 2024): -log sigmoid(beta * (c/|c| - r/|r|) - gamma), no reference model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_logprobs(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of log p over supervised tokens, number of supervised tokens), per sequence."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    mask = labels != -100
    picked = torch.gather(logp, 2, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(-1), mask.sum(-1)


def sft_sum(model, batch: dict) -> tuple[torch.Tensor, dict]:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )
    return loss, {}


def preference_sum(model, chosen: dict, rejected: dict, ref: tuple | None, hyper: dict):
    """Summed DPO or SimPO loss over the pairs of a micro-batch, and summed diagnostics."""
    c, c_len = token_logprobs(model, chosen)
    r, r_len = token_logprobs(model, rejected)
    beta = hyper["beta"]
    if hyper["objective"] == "dpo":
        c_ref, r_ref = ref
        margin = beta * ((c - c_ref) - (r - r_ref))
        loss = -F.logsigmoid(margin)
    else:
        margin = beta * (c / c_len - r / r_len)  # the reward margin; gamma is only a target
        loss = -F.logsigmoid(margin - hyper["simpo_gamma"])
    if hyper["nll_weight"]:
        loss = loss + hyper["nll_weight"] * (-c / c_len)
    diag = {"margin": margin.detach().sum().item(), "pref_acc": (margin > 0).float().sum().item()}
    return loss.sum(), diag
