"""Which rows a static decode step runs on: a prompt's pass shared by its k samples, and the
batch shrunk as rows stop (arenaflow.decode.static's StaticDecoder).

The decoder's per-row buffers stay at fixed addresses (its CUDA graphs read them); a step runs
on their first `n` rows, views of the whole. Shrinking moves the rows still decoding to the
front and narrows `n`; `n` takes the sizes of a ladder (the batch halved, never under
MIN_ROWS), so that a decoder captures graphs for a few sizes only.
"""

from __future__ import annotations

import torch

# a check (every SYNC_EVERY steps) shrinks the batch when at most this fraction of its rows
# still decodes: the rows' state and KV cache are then copied once, a cost of about one step's
# reads of the cache, against every later step's saved rows
SHRINK_AT = 0.5
# rows a shrunk batch keeps at least: at batch 1 dynamo compiles the Llama step apart
MIN_ROWS = 2


def distinct_prompts(ids: torch.Tensor, mask: torch.Tensor, share: int):
    """The first row of each run of `share` consecutive rows (a prompt's k samples), refusing
    rows of a run that differ: a shared prompt pass would decode them as their first's."""
    if share == 1:
        return ids, mask
    if ids.shape[0] % share:
        raise ValueError(f"share={share}: {ids.shape[0]} rows are not whole runs of {share} rows")
    firsts, first_mask = ids[::share], mask[::share]
    same = torch.equal(firsts.repeat_interleave(share, 0), ids) and torch.equal(
        first_mask.repeat_interleave(share, 0), mask
    )
    if not same:
        raise ValueError(
            f"share={share}: the rows of a run of {share} are not one prompt repeated "
            "(input_ids or attention_mask differ)"
        )
    return firsts, first_mask


def spread(t: torch.Tensor, share: int, rows: int | None = None) -> None:
    """In place: t's first rows/share rows, each repeated `share` times, fill its first `rows`
    (default all); along dim 0."""
    rows = t.shape[0] if rows is None else rows
    t[:rows] = t[: rows // share].repeat_interleave(share, 0)


def shrunk_size(live: int, n: int, batch: int) -> int:
    """The rows of a batch of `n` (of `batch`) with `live` rows still decoding: n, or, where at
    most SHRINK_AT of them decode, the smallest size of the ladder batch, batch/2, batch/4, ...
    (rounded up, at least MIN_ROWS) that holds them."""
    if live > n * SHRINK_AT or n <= MIN_ROWS:
        return n
    size = batch
    while True:
        half = -(-size // 2)
        if half < max(live, MIN_ROWS) or half == size:
            return min(size, n)
        size = half


def order(finished: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` rows to keep, in order: those still decoding first (in their order), then
    stopped rows to fill the size (they decode padding)."""
    return torch.argsort(finished.to(torch.uint8), stable=True)[:size]


def gather(tensors, keep: torch.Tensor, along_rows: int | None = None) -> None:
    """In place: each tensor's first len(keep) rows become its rows `keep` (dim 0); with
    `along_rows`, only the first along_rows positions of dim 2 (a KV cache's written rows)."""
    size = keep.shape[0]
    for t in tensors:
        if along_rows is None:
            t[:size] = t.index_select(0, keep)
        else:
            t[:size, :, :along_rows] = t[:, :, :along_rows].index_select(0, keep)
