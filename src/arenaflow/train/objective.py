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


def causal_logits(model, batch: dict) -> torch.Tensor:
    """Logits of a right-padded batch, computed without its attention mask.

    Under the causal mask a real token sees only earlier positions, and right padding keeps
    those real, so the padding mask changes no position that carries loss (the pads' own
    outputs are never read: label -100). Without it SDPA runs its causal flash kernel; with it,
    PyTorch picks cuDNN's masked attention on Hopper, whose plan for each new shape cost 1.3 s
    of a SmolLM2 LoRA job's first step on the H200 (docs/benchmark-log.md)."""
    return model(input_ids=batch["input_ids"]).logits


def token_logprobs(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of log p over supervised tokens, number of supervised tokens), per sequence."""
    logits = causal_logits(model, batch)
    labels = batch["labels"][:, 1:]
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    mask = labels != -100
    picked = torch.gather(logp, 2, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(-1), mask.sum(-1)


def sft_sum(model, batch: dict) -> tuple[torch.Tensor, dict]:
    logits = causal_logits(model, batch)
    loss = F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]),
        batch["labels"][:, 1:].reshape(-1),
        ignore_index=-100,
        reduction="sum",
    )
    return loss, {}


def stack_sides(chosen: dict, rejected: dict) -> dict:
    """Chosen rows then rejected rows as one right-padded batch. A right pad comes after every
    real token and carries label -100, so no real position's log-prob changes
    (causal_logits)."""
    width = max(chosen["input_ids"].shape[1], rejected["input_ids"].shape[1])
    fills = {"input_ids": 0, "attention_mask": 0, "labels": -100}
    return {
        k: torch.cat(
            [F.pad(side[k], (0, width - side[k].shape[1]), value=v) for side in (chosen, rejected)]
        )
        for k, v in fills.items()
    }


def pair_logprobs(model, chosen: dict, rejected: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """token_logprobs of the chosen rows, then the rejected rows, in one forward pass."""
    return token_logprobs(model, stack_sides(chosen, rejected))


def preference_sum(model, chosen: dict, rejected: dict, ref: tuple | None, hyper: dict):
    """Summed DPO or SimPO loss over the pairs of a micro-batch, and summed diagnostics.

    Both sides go through the model in ONE forward pass: half the kernel launches, and one
    forward per backward, which DeepSpeed's ZeRO-3 leaf modules need (two passes before one
    backward reduce a leaf's gradients twice)."""
    lp, n = pair_logprobs(model, chosen, rejected)
    k = chosen["input_ids"].shape[0]
    c, r, c_len, r_len = lp[:k], lp[k:], n[:k], n[k:]
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
