"""Training-time held-out loss (lineage 000 held 150 rows of B3's corpus out of training:
docs/lineages.md#000-lineage-and-corpora).

An SFT arm with `heldout_rows: N` takes N rows of its corpus out before training (before
packing): a seeded choice (the arm's seed, its own stream), so the same arm holds out the same
rows on any world size or resume. It never trains on them. Every `heldout_every` optimizer steps
and after the last one, the loss on them is the training loss's formula, the summed token NLL of
their supervised tokens divided by that count, under the current weights, with dropout off; it
goes into the step's metrics (`heldout_loss`) and the evidence (`heldout`: the row indices in the
corpus, their supervised tokens, every evaluation and the final loss).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from arenaflow.train import data, objective

# the held-out choice's own random stream, apart from the batches' (seed + epoch)
STREAM = 0x48454C44


def split(rows: list, n: int, seed: int) -> tuple[list, list, list[int]]:
    """(training rows, held-out rows, held-out indices in `rows`, ascending)."""
    if n >= len(rows):
        raise SystemExit(
            f"heldout_rows {n} leaves nothing to train on: the corpus has {len(rows)} rows"
        )
    held = sorted(np.random.default_rng([seed, STREAM]).choice(len(rows), n, replace=False))
    out = set(held)
    return [x for i, x in enumerate(rows) if i not in out], [rows[i] for i in held], held


def _shares(n: int, world: int, rank: int, batch: int) -> list[list[int] | None]:
    """This rank's micro-batches of rows rank, rank + world, ...; every rank gets as many (None
    where it has no rows left): under ZeRO-3 each forward is a collective of all ranks."""
    mine = list(range(rank, n, world))
    count = math.ceil(math.ceil(n / world) / batch)
    return [mine[i * batch : (i + 1) * batch] or None for i in range(count)]


def evaluate(engine, rows: list, hyper: dict, pad: int, world: int, rank: int) -> dict:
    """{"loss", "tokens"} over `rows`, summed across ranks."""
    was_training = engine.training
    engine.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=engine.device)
    with torch.no_grad():
        for idx in _shares(len(rows), world, rank, hyper["micro_batch_size"]):
            cpu = data.collate(rows, idx or [0], hyper["seq_len"], pad)
            batch = {k: v.to(engine.device) for k, v in cpu.items()}
            loss, _ = objective.sft_sum(engine, batch)
            if idx is not None:  # a filler forward only keeps the ranks in step
                sums[0] += loss.double()
                sums[1] += data.supervised_tokens(rows, idx, hyper["seq_len"])
    if world > 1:
        torch.distributed.all_reduce(sums)
    engine.train(was_training)
    loss, tokens = float(sums[0]), int(sums[1])
    return {"loss": loss / max(tokens, 1), "tokens": tokens}


def due(step: int, n_steps: int, every: int) -> bool:
    return step == n_steps or (every > 0 and step % every == 0)
