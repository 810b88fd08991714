"""Training data: verified corpora, deterministic global batches, collation and packing.

A global batch is the same set of rows on every rank (one seeded permutation per epoch); each
rank takes its share round-robin and splits it into grad_accum micro-batches. Losses are
normalised by the *global* count (supervised tokens for SFT, pairs for preferences), so 1 rank
and N ranks, and any micro-batch split, optimise the same objective.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from arenaflow import manifest


def _rows(data, prefix: str) -> list[tuple[np.ndarray, np.ndarray]]:
    ids, mask, off = (
        data[f"{prefix}input_ids"],
        data[f"{prefix}loss_mask"],
        data[f"{prefix}offsets"],
    )
    return [(ids[a:b], mask[a:b]) for a, b in zip(off[:-1], off[1:])]


def load_corpus(corpus_dir: Path) -> tuple[dict, dict]:
    """{'sft': rows} or {'chosen': rows, 'rejected': rows} from a corpus whose manifest
    verifies; refuses (ManifestError) one that does not."""
    record = manifest.require(corpus_dir, "training (corpus)")
    if (corpus_dir / "pairs.npz").exists():
        data = np.load(corpus_dir / "pairs.npz")
        return {"chosen": _rows(data, "chosen_"), "rejected": _rows(data, "rejected_")}, record
    return {"sft": _rows(np.load(corpus_dir / "sft.npz"), "")}, record


def pack(rows: list, seq_len: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Greedy first-fit packing of rows (in order) into sequences of at most seq_len tokens.

    Rows in one sequence attend to each other (no block-diagonal mask): the usual trade for
    throughput, acceptable when rows are short relative to seq_len."""
    packed, cur_ids, cur_mask = [], [], []
    for ids, mask in rows:
        ids, mask = ids[:seq_len], mask[:seq_len]
        if cur_ids and sum(map(len, cur_ids)) + len(ids) > seq_len:
            packed.append((np.concatenate(cur_ids), np.concatenate(cur_mask)))
            cur_ids, cur_mask = [], []
        cur_ids.append(ids)
        cur_mask.append(mask)
    if cur_ids:
        packed.append((np.concatenate(cur_ids), np.concatenate(cur_mask)))
    return packed


def steps_per_epoch(n_rows: int, hyper: dict, world: int) -> int:
    per_step = hyper["micro_batch_size"] * hyper["grad_accum"] * world
    if n_rows < hyper["grad_accum"] * world:
        raise SystemExit(
            f"corpus has {n_rows} rows, fewer than one per micro-batch "
            f"(grad_accum {hyper['grad_accum']} x {world} ranks)"
        )
    return max(1, n_rows // per_step)


def total_steps(n_rows: int, hyper: dict, world: int) -> int:
    steps = steps_per_epoch(n_rows, hyper, world) * hyper["epochs"]
    return min(steps, hyper.get("max_steps") or steps)


def global_batches(n_rows: int, hyper: dict, world: int):
    """Yield (step, global row indices) for every optimizer step, in order."""
    per_step = hyper["micro_batch_size"] * hyper["grad_accum"] * world
    spe, step = steps_per_epoch(n_rows, hyper, world), 0
    for epoch in range(hyper["epochs"]):
        order = np.random.default_rng(hyper["seed"] + epoch).permutation(n_rows)
        for s in range(spe):
            step += 1
            yield step, order[s * per_step : (s + 1) * per_step]


def micro_batches(
    glob: np.ndarray, hyper: dict, world: int, rank: int, lengths: np.ndarray | None = None
) -> list[np.ndarray]:
    """This rank's share of a global batch, split into grad_accum micro-batches.

    With `lengths` (each row's token count), the global batch is ordered by length first, so a
    micro-batch holds rows of similar length (less padding: collate pads to the longest row)
    and the ranks get similar loads. The rows of a step, and so the objective, are unchanged."""
    if lengths is not None:
        glob = glob[np.argsort(lengths[glob], kind="stable")]
    return np.array_split(glob[rank::world], hyper["grad_accum"])


def row_lengths(rows, seq_len: int) -> np.ndarray:
    return np.array([min(len(ids), seq_len) for ids, _ in rows])


def padding_fraction(rows, hyper: dict, world: int, bucketing: bool) -> float:
    """Pad tokens / all tokens computed over one epoch's micro-batches (what bucketing saves)."""
    lengths = row_lengths(rows, hyper["seq_len"])
    real = padded = 0
    for _, glob in global_batches(len(rows), {**hyper, "epochs": 1}, world):
        for rank in range(world):
            for micro in micro_batches(glob, hyper, world, rank, lengths if bucketing else None):
                if len(micro):
                    real += int(lengths[micro].sum())
                    padded += int(lengths[micro].max()) * len(micro)
    return 1 - real / max(padded, 1)


def supervised_tokens(rows, idx, seq_len: int) -> int:
    """Tokens that carry loss once labels are shifted (the first token is never predicted)."""
    return int(sum(rows[i][1][1:seq_len].sum() for i in idx))


def collate(rows, idx, seq_len: int, pad_id: int) -> dict:
    """Right-padded input_ids, attention_mask and labels of rows `idx`. Labels and the mask
    come from each row's length and loss mask, never from comparing ids with pad_id: without a
    pad token pad_id is EOS (models.pad_id), and a real EOS is a supervised target."""
    picked = [(r[0][:seq_len], r[1][:seq_len]) for r in (rows[i] for i in idx)]
    width = max(len(x) for x, _ in picked)
    ids = torch.full((len(picked), width), pad_id, dtype=torch.long)
    labels = torch.full((len(picked), width), -100, dtype=torch.long)
    attn = torch.zeros((len(picked), width), dtype=torch.long)
    for i, (x, m) in enumerate(picked):
        x = torch.as_tensor(x, dtype=torch.long)
        ids[i, : len(x)] = x
        attn[i, : len(x)] = 1
        labels[i, : len(x)] = torch.where(torch.as_tensor(m) == 1, x, -100)
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}
