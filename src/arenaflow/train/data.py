"""Training data: verified corpora, deterministic global batches, collation and packing.

A global batch is the same set of rows on every rank (one seeded permutation per epoch); each
rank takes its share round-robin and splits it into grad_accum micro-batches. Losses are
normalised by the *global* count (supervised tokens for SFT, pairs for preferences), so 1 rank
and N ranks, and any micro-batch split, optimise the same objective.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np
import torch

from arenaflow import manifest
from arenaflow.budget import cost as budget

ALL = "all"  # a mixture source's count: every row of the corpus


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


def sample_rows(n_rows: int, count, seed: int, corpus_id: str) -> np.ndarray:
    """Indices of the rows a mixture takes from one source, in corpus order: all of them, or a
    seeded sample of `count` (the arm's seed and the corpus id seed it, so two sources of one
    arm draw independently and the same arm always draws the same rows)."""
    if count == ALL:
        return np.arange(n_rows)
    rng = np.random.default_rng([seed, zlib.crc32(corpus_id.encode())])
    return np.sort(rng.choice(n_rows, size=count, replace=False))


def source_stats(rows: list, corpus_id: str, available: int, record: dict, mpath: Path) -> dict:
    """Rows, tokens and supervised fraction of what a mixture took from one source (tokens
    before packing and truncation, as a corpus's stats.json counts them)."""
    tokens = int(sum(len(ids) for ids, _ in rows))
    supervised = int(sum(int(m.sum()) for _, m in rows))
    return {
        "corpus": corpus_id,
        "rows_available": available,
        "rows": len(rows),
        "tokens": tokens,
        "supervised_tokens": supervised,
        "supervised_fraction": round(supervised / tokens, 6) if tokens else 0.0,
        "digest": record["digest"],
        "manifest_sha256": manifest.sha256_file(mpath),
    }


def load_mixture(dirs: list[Path], mix: dict, seed: int, where: str) -> tuple[dict, dict, list]:
    """An SFT corpus made of several verified corpora: from each (in the order of `mix`, {corpus
    id: row count or 'all'}) all rows or a seeded sample of `count`, concatenated. Returns the
    rows ({'sft': rows}), a record (a digest of the sources' digests, counts and seed: the same
    sources and counts give the same rows) and per-source statistics. `where` (the arm file)
    names the key at fault: a count larger than the corpus, a pairs corpus."""
    if len(dirs) != len(mix):
        raise SystemExit(f"{where}: {len(dirs)} corpus directories for {len(mix)} sources")
    rows, files, sources = [], {}, []
    for d, (cid, count) in zip(dirs, mix.items()):
        loaded, record = load_corpus(Path(d))
        if "sft" not in loaded:
            raise SystemExit(
                f"{where}: key 'corpus/{cid}': {d} is a pairs corpus; a mixture is SFT"
            )
        src = loaded["sft"]
        if count != ALL and count > len(src):
            raise SystemExit(
                f"{where}: key 'corpus/{cid}': {count} rows asked, but corpus {cid!r} has only "
                f"{len(src)} ({d}/stats.json); ask for at most {len(src)} or 'all'"
            )
        picked = [src[i] for i in sample_rows(len(src), count, seed, cid)]
        stats = source_stats(picked, cid, len(src), record, Path(d) / manifest.MANIFEST)
        sources.append({**stats, "asked": count})
        rows += picked
        files.update({f"{cid}/{k}": v for k, v in record["files"].items()})
    digest = mixture_digest(seed, sources, list(mix.values()))
    return {"sft": rows}, {"digest": digest, "files": files}, sources


def mixture_digest(seed: int, sources: list[dict], counts: list) -> str:
    """A mixture's dataset sha256: of its sources' digests, the counts asked and the seed (which
    decide the rows); a bundle recomputes it from the evidence and the corpora it verifies."""
    spec = [
        {"corpus": s["corpus"], "digest": s["digest"], "rows": c} for s, c in zip(sources, counts)
    ]
    return manifest.sha256_text(json.dumps({"seed": seed, "sources": spec}, sort_keys=True))


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
    """Optimizer steps an epoch takes to train every row once (budget.epoch_steps): one per
    global batch of rows, rounded up, or down when the rest would leave a micro-batch empty.
    Dropping the rows past the last full global batch lost up to 48 % of a corpus here."""
    micro = hyper["grad_accum"] * world
    if n_rows < micro:
        raise SystemExit(
            f"corpus has {n_rows} rows, fewer than one per micro-batch "
            f"(grad_accum {hyper['grad_accum']} x {world} ranks)"
        )
    return budget.epoch_steps(n_rows, hyper["micro_batch_size"] * micro, micro)


def total_steps(n_rows: int, hyper: dict, world: int) -> int:
    steps = steps_per_epoch(n_rows, hyper, world) * hyper["epochs"]
    return min(steps, hyper.get("max_steps") or steps)


def global_batches(n_rows: int, hyper: dict, world: int):
    """Yield (step, global row indices) for every optimizer step, in order. An epoch's
    steps_per_epoch steps split its seeded permutation of all rows into parts whose sizes differ
    by at most one row: 533 rows at 512 a step are steps of 267 and 266, not 512 and 21. A step
    of 21 rows would move the weights as far as a full one (Adam's step is about lr x the
    gradient's sign, whatever the batch) in a far noisier direction, and its host-bound time
    would cost as much as a full step's (BENCHMARKS.md, runs 22-24)."""
    spe, step = steps_per_epoch(n_rows, hyper, world), 0
    for epoch in range(hyper["epochs"]):
        order = np.random.default_rng(hyper["seed"] + epoch).permutation(n_rows)
        for part in np.array_split(order, spe):
            step += 1
            yield step, part


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


def largest_micro_batch(corpus: dict, hyper: dict, world: int) -> tuple[int, int] | None:
    """(rows, tokens a row) of the largest micro-batch a run on `corpus` puts through the model,
    as collate pads it; a pairs corpus's micro-batch stacks its chosen and rejected sides. None
    when packing (its sequences are made later) or with too few rows for a step."""
    sides = ("chosen", "rejected") if "chosen" in corpus else ("sft",)
    n = len(corpus[sides[0]])
    if hyper["packing"] or n < hyper["grad_accum"] * world:
        return None
    # rank 0 takes the first of every `world` rows, array_split gives its first micro-batch the most
    step = max(len(g) for _, g in global_batches(n, {**hyper, "epochs": 1}, world))
    rows = math.ceil(math.ceil(step / world) / hyper["grad_accum"])
    length = max(int(row_lengths(corpus[s], hyper["seq_len"]).max()) for s in sides)
    return rows * len(sides), length


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
    pad token pad_id is EOS (models.pad_id), and a real EOS is a supervised target.

    Filled by one scatter over all the rows' tokens, not row by row: the GPU waits for the host
    to collate each micro-batch, and for 264 rows a per-row loop took 9.0 ms on 2 cores, this
    1.1 ms (benchmarks/collate_cpu.py)."""
    picked = [rows[i] for i in idx]
    lengths = np.array([min(len(x), seq_len) for x, _ in picked])
    n, width = len(picked), int(lengths.max())
    tokens = np.concatenate([x[:k] for (x, _), k in zip(picked, lengths)]).astype(np.int64)
    supervised = np.concatenate([m[:k] for (_, m), k in zip(picked, lengths)]) == 1
    # each token's (row, position) in the padded batch
    row = np.repeat(np.arange(n), lengths)
    pos = np.arange(len(tokens)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    labels = np.full((n, width), -100, dtype=np.int64)
    attn = np.zeros((n, width), dtype=np.int64)
    ids[row, pos] = tokens
    attn[row, pos] = 1
    labels[row, pos] = np.where(supervised, tokens, -100)
    return {
        "input_ids": torch.from_numpy(ids),
        "attention_mask": torch.from_numpy(attn),
        "labels": torch.from_numpy(labels),
    }
