"""Which prompts a shard of a sampling or readout job decodes: a contiguous run of whole batches.

generate() (arenaflow.decode.sampling) seeds batch b with seed + b, b counted over the whole
pool, and a batch's samples depend on its prompts and that seed alone. A shard that decodes
batches [first, last) of the pool, seeded with their global indices, therefore writes exactly
the rows the unsharded job writes for them, and the shards' parts concatenated in order are the
unsharded output byte for byte. Of B batches, each of n shards takes B // n, and the first
B % n one more (numpy.array_split's rule): with more shards than batches, the last are empty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SHARD = re.compile(r"(\d+)-of-(\d+)")


@dataclass(frozen=True)
class Span:
    """A shard's batches [first_batch, first_batch + batches) and its prompts [start, stop)."""

    first_batch: int
    batches: int
    start: int
    stop: int


def parse(shard: str) -> tuple[int, int]:
    """'2-of-7' -> (2, 7); anything else, or i outside [0, n), raises ValueError naming it."""
    m = SHARD.fullmatch(shard)
    if m is None or not int(m[1]) < int(m[2]):
        raise ValueError(f"--shard {shard!r}: expected i-of-n with 0 <= i < n, e.g. '0-of-3'")
    return int(m[1]), int(m[2])


def span(prompts: int, per_batch: int, i: int, n: int) -> Span:
    """Shard i of n of `prompts` prompts decoded `per_batch` at a time (see the module doc)."""
    each, more = divmod(-(-prompts // per_batch), n)
    first = i * each + min(i, more)
    last = first + each + (i < more)
    return Span(
        first, last - first, min(first * per_batch, prompts), min(last * per_batch, prompts)
    )
