"""Tensors streamed through safetensors: read in row blocks, combined in float32, written.

Consumes safetensors files by key (Src); produces safetensors files from planned output
tensors (Entry) whose bytes are computed block by block, so that neither an input nor an output
is ever whole in memory. Used by arenaflow.merge.lora and arenaflow.merge.full.
"""

from __future__ import annotations

import json
import math
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

BASE_EPS = 1e-12
BLOCK_BYTES = 32 << 20  # rows read per safe_open slice: bounds the mapped pages in use
PIECE = 1 << 20  # float32 elements per arithmetic step: stays in cache
HANDLE_BYTES = 64 << 20  # a handle maps its whole file; reopened after this much was read
WRITES_AHEAD = 2  # blocks produced but not yet written
ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}


@dataclass(frozen=True)
class Src:
    """One tensor of one safetensors file."""

    path: str
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass
class Entry:
    """One output tensor: produce() yields its bytes in order, as tensors of `dtype`; a yielded
    tensor is never changed afterwards (another thread may still be writing it)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    produce: Callable[[], Iterator[torch.Tensor]]


class Blocks:
    """Output blocks for combine(), recycled once written: a fresh block costs its page faults
    on first touch (~0.25 s a GB on the 2-core VM), a recycled one nothing. The writer thread
    returns them, so the lists are locked."""

    def __init__(self):
        self.free: list[torch.Tensor] = []
        self.lent: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()

    def get(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = n * dtype.itemsize
        with self.lock:
            raw = next((b for b in self.free if b.numel() >= nbytes), None)
            if raw is not None:
                self.free.remove(raw)
        raw = raw if raw is not None else torch.empty(max(nbytes, BLOCK_BYTES), dtype=torch.uint8)
        with self.lock:
            self.lent[raw.data_ptr()] = raw
        return raw[:nbytes].view(dtype)

    def recycle(self, t: torch.Tensor) -> None:
        """Take back a block once written; anything else (a view on a parent's file) is ignored."""
        with self.lock:
            raw = self.lent.pop(t.data_ptr(), None)
            if raw is not None:
                self.free.append(raw)


class Reader:
    """Tensors through safe_open, counting the bytes read. A handle maps its whole file and the
    pages read through it stay in this process's RSS until it closes, so a handle is reopened
    once HANDLE_BYTES were read through it."""

    def __init__(self):
        self.handles: dict[str, tuple] = {}
        self.bytes_read = 0
        self.blocks = Blocks()

    def _handle(self, path: str):
        f, used = self.handles.get(path, (None, HANDLE_BYTES))
        if used >= HANDLE_BYTES:
            f = safe_open(path, framework="pt")
            used = 0
        return f, used

    def rows(self, src: Src, r0: int | None = None, r1: int | None = None) -> torch.Tensor:
        """Rows r0:r1 (default all) of `src`, flat; a view on the file's pages, not a copy."""
        f, used = self._handle(src.path)
        t = f.get_tensor(src.key) if r0 is None else f.get_slice(src.key)[r0:r1]
        n = t.numel() * t.element_size()
        self.handles[src.path] = (f, used + n)
        self.bytes_read += n
        return t.reshape(-1)

    def close(self) -> None:
        self.handles.clear()
        self.blocks = Blocks()


def row_ranges(shape: tuple[int, ...], itemsize: int) -> list[tuple[int | None, int | None]]:
    """Row blocks of about BLOCK_BYTES; (None, None) for a tensor read whole."""
    row_bytes = math.prod(shape[1:]) * itemsize
    if not shape or row_bytes * shape[0] <= BLOCK_BYTES:
        return [(None, None)]
    step = max(1, BLOCK_BYTES // max(row_bytes, 1))
    return [(r, min(r + step, shape[0])) for r in range(0, shape[0], step)]


def combine(
    reader: Reader, terms: list[tuple[float, Src]], dtype: torch.dtype
) -> Iterator[torch.Tensor]:
    """sum_j c_j T_j, block by block, in float32 (rounded once to `dtype`)."""
    (c0, s0), shape = terms[0], terms[0][1].shape
    same = all(s.dtype == dtype for _, s in terms)
    if len(terms) == 1 and c0 == 1.0 and same:
        for r0, r1 in row_ranges(shape, dtype.itemsize):
            yield reader.rows(s0, r0, r1)  # a plain copy: exact, and no arithmetic
    elif len(terms) == 2 and abs(c0 + terms[1][0] - 1.0) <= BASE_EPS and same:
        # c0 T0 + c1 T1 with c0 = 1 - c1 (two-parent soups, doses, one parent and the base) is
        # torch.lerp, one pass computing in float32 (bf16 included) instead of four
        for r0, r1 in row_ranges(shape, dtype.itemsize):
            a, b = reader.rows(s0, r0, r1), reader.rows(terms[1][1], r0, r1)
            yield torch.lerp(a, b, terms[1][0], out=reader.blocks.get(a.numel(), dtype))
    else:
        yield from weighted_sum(reader, terms, dtype)


def weighted_sum(
    reader: Reader, terms: list[tuple[float, Src]], dtype: torch.dtype
) -> Iterator[torch.Tensor]:
    """sum_j c_j T_j in float32 pieces that stay in cache, each rounded once to `dtype`."""
    acc, tmp = torch.empty(PIECE), torch.empty(PIECE)
    for r0, r1 in row_ranges(terms[0][1].shape, max(s.dtype.itemsize for _, s in terms)):
        parts = [reader.rows(s, r0, r1) for _, s in terms]
        out = reader.blocks.get(parts[0].numel(), dtype)
        for a in range(0, out.numel(), PIECE):
            b = min(a + PIECE, out.numel())
            acc_ = acc[: b - a]
            acc_.copy_(parts[0][a:b]).mul_(terms[0][0])
            for (c, _), p in zip(terms[1:], parts[1:]):
                acc_.add_(tmp[: b - a].copy_(p[a:b]), alpha=c)
            out[a:b].copy_(acc_)
        yield out


def write_safetensors(path: Path, entries: list[Entry], recycle: Callable | None = None) -> int:
    """Write a safetensors file whose tensors are produced one after the other; return its size.
    The header is laid out from the planned shapes first, so no tensor needs to wait for another.
    recycle(t) is called on each produced tensor once it is written."""
    # widest dtypes first keeps every tensor aligned to its item size (safetensors' own order);
    # the sort is stable, so a module's A stays just before its B
    entries = sorted(entries, key=lambda e: -e.dtype.itemsize)
    header, offset = {}, 0
    for e in entries:
        n = math.prod(e.shape) * e.dtype.itemsize
        header[e.name] = {
            "dtype": ST_NAMES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    header["__metadata__"] = {"format": "pt"}  # transformers refuses a file without it
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    # a second thread writes while this one computes the next block (write(2) and torch both
    # release the GIL); WRITES_AHEAD bounds the blocks held for it
    with open(path, "wb") as f, ThreadPoolExecutor(max_workers=1) as writer:

        def put(t: torch.Tensor) -> None:
            f.write(t.reshape(-1).view(torch.uint8).numpy())
            if recycle:
                recycle(t)

        pending: deque = deque([writer.submit(f.write, struct.pack("<Q", len(raw)) + raw)])
        for e in entries:
            write_entry(writer, pending, put, e)
        for fut in pending:
            fut.result()
    return 8 + len(raw) + offset


def write_entry(writer: ThreadPoolExecutor, pending: deque, put: Callable, e: Entry) -> None:
    expected, written = math.prod(e.shape) * e.dtype.itemsize, 0
    for t in e.produce():
        if t.dtype != e.dtype:
            raise RuntimeError(f"{e.name}: produced {t.dtype}, planned {e.dtype}")
        t = t.contiguous()
        pending.append(writer.submit(put, t))
        written += t.numel() * t.element_size()
        while len(pending) > WRITES_AHEAD:
            pending.popleft().result()
    if written != expected:
        raise RuntimeError(f"{e.name}: produced {written} bytes, planned {expected}")
