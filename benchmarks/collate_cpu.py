"""How long the host takes to collate a training micro-batch: train/data.collate, one
scatter over every token, against the row-by-row fill it replaced, on the same rows.

    python benchmarks/collate_cpu.py [--rows 264 --min-len 40 --max-len 100 --repeat 50]

The GPU waits while the host collates each micro-batch (the step before ended by reading its
loss), so a training's busy fraction pays this every micro-batch. The defaults are R220's
micro-batch in the SmolLM2 lineage on the H200 (264 rows, up to 99 tokens). Prints both
times, their ratio, and whether the two batches are equal.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from arenaflow.train import data


def row_by_row(rows, idx, seq_len: int, pad_id: int) -> dict:
    """data.collate until 2026-12-04."""
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


def timed(fn, repeat: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=264)
    ap.add_argument("--min-len", type=int, default=40)
    ap.add_argument("--max-len", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    gen = np.random.default_rng(0)
    rows = [  # token ids as a corpus stores them (int32), the prompt's 30 tokens unsupervised
        (gen.integers(0, 49152, n, dtype=np.int32), (np.arange(n) >= 30).astype(np.int8))
        for n in gen.integers(args.min_len, args.max_len, args.rows)
    ]
    idx = np.arange(args.rows)
    new = timed(lambda: data.collate(rows, idx, 512, 2), args.repeat)
    old = timed(lambda: row_by_row(rows, idx, 512, 2), args.repeat)
    a, b = data.collate(rows, idx, 512, 2), row_by_row(rows, idx, 512, 2)
    same = all(torch.equal(a[k], b[k]) for k in a)
    print(
        f"{args.rows} rows: collate {new * 1e3:.2f} ms, row by row {old * 1e3:.2f} ms "
        f"({old / new:.1f}x); same batch: {same}"
    )


if __name__ == "__main__":
    main()
