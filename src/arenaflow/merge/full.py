"""Full-weight parents merged tensor by tensor into a model directory.

Consumes the parents' (and the base's) safetensors headers; plans every output tensor as the
weighted sum of the parents' and writes it in shards named as save_pretrained names them, with
an index when there are several, and the first parent's config.json/generation_config.json.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

from arenaflow import io
from arenaflow.merge.parents import FULL_INDEX, Base, MergeError, Parent, base_terms
from arenaflow.merge.stream import Entry, Reader, combine, write_safetensors


def plan_full(parents: list[Parent], base: Base, reader: Reader) -> dict:
    first = parents[0]
    for p in parents[1:]:
        for a, b in ((p, first), (first, p)):
            extra = sorted(set(a.index) - set(b.index))
            if extra:
                raise MergeError(
                    f"parent {a.arm} has tensor {extra[0]} (and {len(extra) - 1} more) "
                    f"that parent {b.arm} lacks"
                )
    c0 = 1.0 - sum(p.weight for p in parents)
    entries = [full_entry(parents, base, reader, key, c0) for key in sorted(first.index)]
    return {"entries": entries, "rank": None, "errors": None, "representation": "full weights"}


def full_entry(parents: list[Parent], base: Base, reader: Reader, key: str, c0: float) -> Entry:
    src0 = parents[0].index[key]
    for p in parents:
        s = p.index[key]
        if s.shape != src0.shape:
            raise MergeError(
                f"parent {p.arm}: tensor {key} has shape {list(s.shape)}, parent "
                f"{parents[0].arm}'s {list(src0.shape)}"
            )
    b = base.index.get(key)
    if b is not None and b.shape != src0.shape:
        raise MergeError(
            f"parent {parents[0].arm}: tensor {key} has shape {list(src0.shape)}, the "
            f"base's {b.key} {list(b.shape)} (base model {base.path})"
        )
    if not src0.dtype.is_floating_point:  # integer buffers are not weights: the first parent's
        return Entry(
            key, src0.dtype, src0.shape, lambda: combine(reader, [(1.0, src0)], src0.dtype)
        )
    terms = [(p.weight, p.index[key]) for p in parents]
    terms += base_terms(base, key, c0, src0.shape, f"parents {[p.arm for p in parents]}")
    return Entry(key, src0.dtype, src0.shape, lambda: combine(reader, terms, src0.dtype))


def shard(entries: list[Entry], shard_bytes: int) -> list[list[Entry]]:
    shards, size = [[]], 0
    for e in entries:
        n = math.prod(e.shape) * e.dtype.itemsize
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += n
    return shards


def write_full(plan: dict, tmp: Path, first: Parent, shard_bytes: int, recycle: Callable) -> None:
    """The shards (write_shards) and the first parent's config.json/generation_config.json."""
    write_shards(plan["entries"], tmp, shard_bytes, recycle)
    for name in ("config.json", "generation_config.json"):
        if (first.dir / name).exists():
            shutil.copyfile(first.dir / name, tmp / name)


def write_shards(entries: list[Entry], tmp: Path, shard_bytes: int, recycle: Callable) -> None:
    """Shards named as transformers' save_pretrained names them, an index when there are several."""
    shards = shard(entries, shard_bytes)
    n = len(shards)
    names = (
        ["model.safetensors"]
        if n == 1
        else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    )
    weight_map, total = {}, 0
    for name, group in zip(names, shards):
        write_safetensors(tmp / name, group, recycle)
        for e in group:
            weight_map[e.name] = name
            total += math.prod(e.shape) * e.dtype.itemsize
    if n > 1:
        io.write_json(
            tmp / FULL_INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map}
        )
