"""Weight-space merges as arms: model soups and dose-line interpolation (issue 19).

    python -m arenaflow.merge.build --arm soup --base-model models/tiny-arith \\
        --parent B3=runs/B3/final:0.5 --parent B2=runs/B2/final:0.5 [--rank K] \\
        [--shard-bytes 2G] --out runs/soup/final

Each --parent is ARM=DIR:WEIGHT (the weight after the last ':', so DIR may hold ':'); a weight is
any real number. A dose x = from + alpha (to - from) is --parent FROM=...:1-alpha
--parent TO=...:alpha (`dose()` builds that list).

One formula for everything:

    merged = base + sum_i w_i (P_i - base)  =  (1 - sum_i w_i) base + sum_i w_i P_i

Parents of weight exactly 0 are dropped. The base's own coefficient 1 - sum w_i is taken as 0
within 1e-12 (1 - alpha + alpha rounds), and only then are its tensors never read.

LoRA parents (every run of a lineage is a full delta from the same base, a child continuing its
parent's adapter): a module's delta in parent i is s_i B_i A_i (s_i = lora_alpha / r, or
/ sqrt(r) with rsLoRA, per module with rank_pattern/alpha_pattern), so the merged delta is

    sum_i w_i s_i B_i A_i  =  [w_1 s_1 B_1, w_2 s_2 B_2, ...] @ [A_1; A_2; ...]

which is exactly one adapter of concatenated rank with scaling 1 (lora_alpha = r; exact up to
rounding w_i s_i B_i once to the parents' dtype, nothing when s_i w_i is a power of 2). Averaging
the A and B matrices instead would give (sum w_i B_i)(sum w_j A_j), whose cross terms B_i A_j belong
to no parent. Parents of different ranks or target modules are padded with zero rows/columns so that
every module has the same rank R (zero factors add nothing, so this stays exact and loads with a
plain PeftModel.from_pretrained). With rank=k each module's delta is instead truncated to its best
rank-k approximation, from the factors alone (QR of B_cat and A_cat^T, SVD of the small R x R core),
and the relative Frobenius error of each module is recorded. The output's adapter_config.json is the
first parent's with r, lora_alpha, rank_pattern/alpha_pattern, use_rslora and modules_to_save (the
union) replaced; target_modules is the union of the parents' when PEFT would match exactly the
modules written with it, else their full names (a parent's layers_to_transform and exclude_modules
are cleared, so the union could reach further).

Tensors an adapter carries whole (modules_to_save, e.g. lm_head) follow the formula as they are;
a parent without one contributes the base's (for a tied head, the base's input embedding).
Full-weight parents follow it tensor by tensor. Adapters and full weights cannot be mixed.

Python: merge(parents=[(arm, run_dir, weight), ...], base_model, out, arm, rank=None,
shard_bytes=2**31) returns the evidence it writes to out/merge_evidence.json; dose(from, to,
alpha) gives the parents of a dose. Bad input raises MergeError (a ValueError) naming the parent
and tensor; a parent whose manifest does not verify, manifest.ManifestError naming the parent.

Streaming: every parent is verified against its manifest (sha256, in threads) before anything of
it is read; then tensors are read through safetensors.safe_open in row blocks of BLOCK_BYTES and
written by a safetensors writer that lays the header out first, so neither a parent nor an output
shard is ever whole in memory (peak: a few blocks per parent plus recycled output blocks). The
arithmetic is float32, rounded once to the parents' dtype (two terms whose coefficients sum to 1,
the usual soup or dose, go through torch.lerp: one pass instead of four). Output: the weights,
adapter_config.json (or config.json), merge_evidence.json and manifest.json, all through
io.atomic_dir: a failed merge leaves no output directory.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from arenaflow import io, manifest
from arenaflow.models import ADAPTER_CONFIG, ADAPTER_WEIGHTS

FULL_INDEX = "model.safetensors.index.json"
EVIDENCE = "merge_evidence.json"
PREFIX = "base_model.model."  # PEFT's prefix on every key of a LoRA adapter file
FACTOR = {
    "lora_A.weight": "A",
    "lora_B.weight": "B",
    "lora_embedding_A": "A",
    "lora_embedding_B": "B",
}
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
# LoraConfig fields whose non-default value makes a parent's delta something other than s B A
UNSUPPORTED = {
    "use_dora": False,
    "lora_bias": False,
    "bias": "none",
    "target_parameters": None,
    "alora_invocation_tokens": None,
    "arrow_config": None,
    "use_bdlora": None,
    "trainable_token_indices": None,
    "layer_replication": None,
    "use_qalora": False,
    "ensure_weight_tying": False,
}
BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")


class MergeError(ValueError):
    """Bad merge input; the message names the parent and tensor at fault."""


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
class Parent:
    arm: str
    dir: Path
    weight: float
    kind: str = ""  # "adapter" | "full"
    record: dict = field(default_factory=dict)  # its verified manifest
    config: dict = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # weight files, relative to dir
    index: dict[str, Src] = field(default_factory=dict)


@dataclass
class Entry:
    """One output tensor: produce() yields its bytes in order, as tensors of `dtype`; a yielded
    tensor is never changed afterwards (another thread may still be writing it)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    produce: Callable[[], Iterator[torch.Tensor]]


# ---------------------------------------------------------------- reading


def index_files(paths: list[Path]) -> dict[str, Src]:
    """key -> Src for every tensor of the files, from their headers only."""
    out = {}
    for path in paths:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                if sl.get_dtype() not in ST_DTYPES:
                    raise MergeError(
                        f"{path}: tensor {key} has dtype {sl.get_dtype()}, which this merge "
                        f"does not handle ({sorted(ST_DTYPES)})"
                    )
                out[key] = Src(str(path), key, tuple(sl.get_shape()), ST_DTYPES[sl.get_dtype()])
    return out


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


# ---------------------------------------------------------------- writing


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


# ---------------------------------------------------------------- parents and base


def parse_parents(
    parents: list[tuple[str, str, float]], out: Path
) -> tuple[list[Parent], list[str]]:
    """The parents of non-zero weight, and the arms dropped for weight 0."""
    seen, used, dropped = set(), [], []
    for arm, d, w in parents:
        if arm in seen:
            raise MergeError(f"parent {arm} is given twice")
        seen.add(arm)
        if not isinstance(w, (int, float)) or not math.isfinite(w):
            raise MergeError(f"parent {arm}: weight {w!r} is not a finite number")
        if w == 0:  # never read, so it need not exist
            dropped.append(arm)
            continue
        if not Path(d).is_dir():
            raise MergeError(f"parent {arm}: {d} is not a directory")
        if Path(d).resolve() == out.resolve():
            raise MergeError(f"parent {arm}: {d} is also the output directory")
        used.append(Parent(arm, Path(d), float(w)))
    if not used:
        raise MergeError(
            f"no parent has a non-zero weight (given: {[(a, w) for a, _, w in parents]})"
        )
    return used, dropped


def detect_kind(p: Parent) -> str:
    if (p.dir / ADAPTER_CONFIG).exists():
        return "adapter"
    if (p.dir / "config.json").exists() and (
        (p.dir / "model.safetensors").exists() or (p.dir / FULL_INDEX).exists()
    ):
        return "full"
    raise MergeError(
        f"parent {p.arm}: {p.dir} holds neither a LoRA adapter ({ADAPTER_CONFIG}) "
        "nor full weights (config.json + model*.safetensors)"
    )


def check_kinds(parents: list[Parent]) -> str:
    for p in parents:
        p.kind = detect_kind(p)
    kinds = {p.kind for p in parents}
    if len(kinds) > 1:
        by = {k: [p.arm for p in parents if p.kind == k] for k in sorted(kinds)}
        raise MergeError(
            f"cannot merge LoRA adapters {by['adapter']} with full weights {by['full']}: "
            "merge adapters with adapters, or merge the adapters into full weights first"
        )
    return kinds.pop()


def verify(parents: list[Parent], arm: str) -> None:
    """manifest.require on every parent before any is read; the sha256 passes run in threads
    (hashlib releases the GIL), the first failure in the parents' order is raised."""

    def one(p: Parent) -> dict:
        try:
            return manifest.require(p.dir, f"merge {arm}")
        except manifest.ManifestError as e:
            raise manifest.ManifestError(f"parent {p.arm}: {e}") from None

    with ThreadPoolExecutor(max_workers=min(len(parents), 4)) as ex:
        for p, rec in zip(parents, ex.map(one, parents)):
            p.record = rec


def weight_files(d: Path, single: str, index_name: str) -> list[str]:
    if (d / index_name).exists():
        return sorted(set(io.read_json(d / index_name)["weight_map"].values()))
    return [single]


def load_parent(p: Parent) -> None:
    """Its config and the headers of its weight files (no tensor is read here)."""
    if p.kind == "adapter":
        p.config = io.read_json(p.dir / ADAPTER_CONFIG)
        p.files = [ADAPTER_WEIGHTS]
    else:
        p.config = io.read_json(p.dir / "config.json")
        p.files = weight_files(p.dir, "model.safetensors", FULL_INDEX)
    for f in p.files:
        if not (p.dir / f).is_file():
            raise MergeError(f"parent {p.arm}: {p.dir / f} is missing")
    p.index = index_files([p.dir / f for f in p.files])


@dataclass
class Base:
    path: Path
    index: dict[str, Src]
    tied: dict[str, str] | None = None  # key -> the base key it is tied to; read when first needed

    def src(self, key: str) -> Src | None:
        if key in self.index:
            return self.index[key]
        if self.tied is None:
            self.tied = tied_keys(self.path)  # imports transformers: only for a key the file lacks
        return self.index.get(self.tied.get(key, ""))


def load_base(path: str) -> Base:
    d = Path(path)
    if not (d / "config.json").exists():
        raise MergeError(f"base model {path}: no config.json (not a model directory)")
    return Base(d, index_files([d / f for f in weight_files(d, "model.safetensors", FULL_INDEX)]))


def tied_keys(d: Path) -> dict[str, str]:
    """{'lm_head.weight': 'model.embed_tokens.weight'} where the base ties its head: its file
    then has no head, and a head's base value is the embedding (transformers' own mapping)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(str(d))
        if not getattr(cfg.get_text_config(), "tie_word_embeddings", False):
            return {}
        tied = AutoModelForCausalLM._model_mapping[type(cfg)]._tied_weights_keys
        return dict(tied) if isinstance(tied, dict) else {}
    except (ImportError, KeyError, ValueError, OSError, AttributeError):
        return {}  # an unknown architecture: a missing base tensor is then an error where needed


def base_terms(
    base: Base, key: str, coef: float, shape: tuple, who: str
) -> list[tuple[float, Src]]:
    """[(coef, the base's tensor)] when the base enters the formula (|coef| > BASE_EPS), else []."""
    if abs(coef) <= BASE_EPS:
        return []
    src = base.src(key)
    if src is None:
        raise MergeError(
            f"{who}: tensor {key} needs the base's value (its coefficient is {coef:g}), "
            f"but base model {base.path} has no such tensor"
        )
    if src.shape != shape:
        raise MergeError(
            f"{who}: tensor {key} has shape {list(shape)}, the base's {list(src.shape)}"
        )
    return [(coef, src)]


# ---------------------------------------------------------------- LoRA adapters


@dataclass
class Module:
    """One adapted module across the parents: its merged delta is sum_j coef_j B_j A_j."""

    name: str
    a_key: str
    b_key: str
    out_features: int  # rows of B
    in_features: int  # columns of A
    dtype: torch.dtype
    parts: list[tuple[float, Src, Src]] = field(default_factory=list)  # (w_i s_i, A_i, B_i)

    @property
    def rank(self) -> int:
        return sum(a.shape[0] for _, a, _ in self.parts)


@dataclass
class Whole:
    """A tensor an adapter carries whole (modules_to_save)."""

    key: str
    base_key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    parts: list[tuple[float, Src, str]] = field(default_factory=list)  # (w_i, T_i, arm)


def check_adapter_config(p: Parent) -> None:
    cfg = p.config
    if cfg.get("peft_type") != "LORA":
        raise MergeError(
            f"parent {p.arm}: peft_type {cfg.get('peft_type')!r}; only LoRA adapters merge"
        )
    for name, default in UNSUPPORTED.items():
        if cfg.get(name, default) not in (default, None, False, [], {}):
            raise MergeError(
                f"parent {p.arm}: {name}={cfg[name]!r} in {ADAPTER_CONFIG}: this merge "
                "knows plain LoRA only (delta = scaling * B @ A, plus modules_to_save)"
            )
    init = cfg.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(BASE_CHANGING_INITS):
        raise MergeError(
            f"parent {p.arm}: init_lora_weights={init!r} changes the base weights, so "
            "the adapter is not a delta from the base"
        )


def pattern_key(patterns: dict, module: str) -> str:
    """The rank_pattern/alpha_pattern key that applies to `module`, as
    peft.utils.other.get_pattern_key matches it (PEFT 0.21; importing PEFT would cost this job
    ~2.5 s)."""
    return next((k for k in patterns if re.match(rf"(.*\.)?({k})$", module)), module)


def scaling(p: Parent, module: str, r: int) -> float:
    """PEFT's scaling for `module` (LoraModel._create_and_replace, LoraLayer.update_layer)."""
    cfg = p.config
    ranks, alphas = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    r_cfg = ranks.get(pattern_key(ranks, module), cfg["r"])
    if r_cfg != r:
        raise MergeError(
            f"parent {p.arm}: module {module} has rank {r} in {ADAPTER_WEIGHTS} but "
            f"{r_cfg} in {ADAPTER_CONFIG}"
        )
    alpha = alphas.get(pattern_key(alphas, module), cfg["lora_alpha"])
    return alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r


def split_keys(p: Parent) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """{module: {"A": key, "B": key}} and {base key: key} of the tensors carried whole
    (modules_to_save, and an adapted embedding's own weight, which PEFT saves beside its
    factors)."""
    factors, whole = {}, {}
    saved = p.config.get("modules_to_save") or []
    for key in p.index:
        if not key.startswith(PREFIX):
            raise MergeError(f"parent {p.arm}: tensor {key} lacks PEFT's prefix {PREFIX!r}")
        rest = key[len(PREFIX) :]
        suffix = next((s for s in FACTOR if rest.endswith("." + s)), None)
        if suffix:
            factors.setdefault(rest[: -len(suffix) - 1], {})[FACTOR[suffix]] = key
        elif any(re.match(rf"(^|.*\.){m}($|\..*)", rest) for m in saved):
            whole[rest] = key
        elif ".base_layer." in rest:  # PEFT's save_embedding_layers: the adapted layer's own weight
            whole[rest.replace(".base_layer.", ".")] = key
        else:
            raise MergeError(
                f"parent {p.arm}: tensor {key} is neither a LoRA factor nor part of "
                f"modules_to_save {saved}; this merge does not know its semantics"
            )
    for module, ab in factors.items():
        if set(ab) != {"A", "B"}:
            ((has, key),) = ab.items()
            raise MergeError(
                f"parent {p.arm}: module {module} has {key} but no lora_{'AB'.strip(has)} factor"
            )
    return factors, whole


def add_module(
    p: Parent, base: Base, modules: dict[str, Module], name: str, ab: dict[str, str]
) -> None:
    a, b = p.index[ab["A"]], p.index[ab["B"]]
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise MergeError(
            f"parent {p.arm}: {a.key} {list(a.shape)} / {b.key} {list(b.shape)}: only "
            "Linear and Embedding LoRA (2-D factors) merge"
        )
    if b.shape[1] != a.shape[0]:
        raise MergeError(
            f"parent {p.arm}: {b.key} {list(b.shape)} does not multiply {a.key} {list(a.shape)}"
        )
    # PEFT stores an Embedding's factors, and a fan_in_fan_out (Conv1D) layer's, transposed
    transposed = "embedding" in a.key or p.config.get("fan_in_fan_out")
    want = (a.shape[1], b.shape[0]) if transposed else (b.shape[0], a.shape[1])
    src = base.index.get(name + ".weight")
    if src is None or src.shape != want:
        got = "no such tensor" if src is None else f"shape {list(src.shape)}"
        raise MergeError(
            f"parent {p.arm}: module {name} ({a.key}) implies a base weight of shape "
            f"{list(want)}, base model {base.path} has {got} at {name}.weight"
        )
    m = modules.setdefault(name, Module(name, a.key, b.key, b.shape[0], a.shape[1], a.dtype))
    if (m.a_key, m.b_key) != (a.key, b.key):
        raise MergeError(
            f"parent {p.arm}: module {name} is stored as {a.key}, another parent's as {m.a_key}"
        )
    m.parts.append((p.weight * scaling(p, name, a.shape[0]), a, b))


def add_whole(p: Parent, base: Base, wholes: dict[str, Whole], base_key: str, key: str) -> None:
    t = p.index[key]
    w = wholes.setdefault(base_key, Whole(key, base_key, t.shape, t.dtype))
    if t.shape != w.shape:
        raise MergeError(
            f"parent {p.arm}: tensor {key} has shape {list(t.shape)}, "
            f"parent {w.parts[0][2]}'s {list(w.shape)}"
        )
    src = base.index.get(base_key)  # a tied head is checked in base_terms, if the base is needed
    if src is not None and src.shape != t.shape:
        raise MergeError(
            f"parent {p.arm}: tensor {key} has shape {list(t.shape)}, the base's "
            f"{src.key} {list(src.shape)} (base model {base.path})"
        )
    w.parts.append((p.weight, t, p.arm))


def collect(parents: list[Parent], base: Base) -> tuple[dict[str, Module], dict[str, Whole]]:
    modules, wholes = {}, {}
    if len({bool(p.config.get("fan_in_fan_out")) for p in parents}) > 1:
        raise MergeError(f"parents {[p.arm for p in parents]} disagree on fan_in_fan_out")
    for p in parents:
        check_adapter_config(p)
        factors, whole = split_keys(p)
        for name, ab in factors.items():
            add_module(p, base, modules, name, ab)
        for base_key, key in whole.items():
            add_whole(p, base, wholes, base_key, key)
    both = sorted(
        m
        for m in modules
        for w in wholes.values()
        if w.base_key.startswith(m + ".") and ".base_layer." not in w.key
    )
    if both:
        raise MergeError(
            f"modules {both} are LoRA targets in one parent and modules_to_save in another"
        )
    return modules, wholes


def concat_entries(m: Module, rank: int, reader: Reader) -> list[Entry]:
    """A = [A_1; A_2; ...; 0], B = [c_1 B_1, c_2 B_2, ..., 0]: exactly sum_j c_j B_j A_j."""

    def a() -> Iterator[torch.Tensor]:
        for _, src, _ in m.parts:
            yield reader.rows(src).to(m.dtype)
        yield torch.zeros((rank - m.rank) * m.in_features, dtype=m.dtype)

    def b() -> Iterator[torch.Tensor]:
        out, at = torch.zeros(m.out_features, rank), 0
        for c, a_src, b_src in m.parts:
            r = a_src.shape[0]
            out[:, at : at + r] = reader.rows(b_src).view(b_src.shape).float() * c
            at += r
        yield out.to(m.dtype)

    return [
        Entry(m.a_key, m.dtype, (rank, m.in_features), a),
        Entry(m.b_key, m.dtype, (m.out_features, rank), b),
    ]


def truncate(m: Module, k: int, reader: Reader) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(A_k, B_k, relative Frobenius error) of the best rank-k B_k A_k for sum_j c_j B_j A_j.
    With B_cat = Qb Rb and A_cat^T = Qa Ra the delta is Qb (Rb Ra^T) Qa^T, and the Q's are
    orthonormal: the SVD of the R x R core is the delta's, at the factors' cost."""
    a = torch.cat([reader.rows(s).view(s.shape).float() for _, s, _ in m.parts])
    b = torch.cat([reader.rows(s).view(s.shape).float() * c for c, _, s in m.parts], dim=1)
    qb, rb = torch.linalg.qr(b)
    qa, ra = torch.linalg.qr(a.T)
    u, s, vh = torch.linalg.svd(rb @ ra.T)
    j = min(k, s.numel())
    root = s[:j].sqrt()
    a_k = torch.zeros(k, m.in_features)
    b_k = torch.zeros(m.out_features, k)
    a_k[:j] = (root[:, None] * vh[:j]) @ qa.T
    b_k[:, :j] = qb @ (u[:, :j] * root)
    total = s.square().sum()
    err = float((s[j:].square().sum() / total).sqrt()) if total > 0 else 0.0
    return a_k.to(m.dtype), b_k.to(m.dtype), err


def svd_entries(m: Module, k: int, reader: Reader, errors: dict[str, float]) -> list[Entry]:
    held: dict[str, torch.Tensor] = {}  # one module's factors, between writing its A and its B

    def take(which: str) -> Iterator[torch.Tensor]:
        if which not in held:
            held["A"], held["B"], errors[m.name] = truncate(m, k, reader)
        yield held.pop(which)

    return [
        Entry(m.a_key, m.dtype, (k, m.in_features), lambda: take("A")),
        Entry(m.b_key, m.dtype, (m.out_features, k), lambda: take("B")),
    ]


def whole_entry(w: Whole, base: Base, reader: Reader) -> Entry:
    """T = (1 - sum w_i) base + sum w_i T_i over the parents carrying T: a parent without it
    contributes the base's value."""
    terms = [(wt, src) for wt, src, _ in w.parts]
    arms = [arm for _, _, arm in w.parts]
    terms += base_terms(
        base, w.base_key, 1.0 - sum(wt for wt, _ in terms), w.shape, f"parents {arms}"
    )
    return Entry(w.key, w.dtype, w.shape, lambda: combine(reader, terms, w.dtype))


def peft_targets(targets: list[str], saved: list[str] | None, module: str) -> bool:
    """Whether a LoraConfig with these target_modules (a list) and modules_to_save adapts `module`:
    peft.tuners.tuners_utils.check_target_module_exists of PEFT 0.21, without layers_to_transform
    and exclude_modules (the output clears both)."""
    if any(re.match(rf"(^|.*\.){m}($|\..*)", module) for m in saved or []):
        return False
    return module in targets or any(module.endswith("." + t) for t in targets)


def target_modules(
    parents: list[Parent], modules: dict[str, Module], base: Base, saved
) -> list[str]:
    """The union of the parents' target_modules, when PEFT would match exactly the modules
    written with it; else the written modules by full name (e.g. a parent's layers_to_transform,
    cleared in the output, would otherwise match modules that no file holds)."""
    lists = [p.config.get("target_modules") for p in parents]
    if all(isinstance(t, list) for t in lists):
        union = sorted(set().union(*lists))
        names = {k[: -len(".weight")] for k in base.index if k.endswith(".weight")}
        if {n for n in names if peft_targets(union, saved, n)} == set(modules):
            return union
    return sorted(modules)


def adapter_config(
    parents: list[Parent], modules: dict[str, Module], base: Base, rank: int
) -> dict:
    cfg = dict(parents[0].config)
    saved = sorted({m for p in parents for m in p.config.get("modules_to_save") or []}) or None
    cfg.update(
        r=rank,
        lora_alpha=rank,
        rank_pattern={},
        alpha_pattern={},
        use_rslora=False,
        modules_to_save=saved,
        target_modules=target_modules(parents, modules, base, saved),
        layers_to_transform=None,
        layers_pattern=None,
        exclude_modules=None,
        # every matched module is in the file; were one not, it must start at zero delta
        init_lora_weights=True,
    )
    return cfg


def plan_adapter(parents: list[Parent], base: Base, reader: Reader, rank: int | None) -> dict:
    modules, wholes = collect(parents, base)
    if not modules:
        raise MergeError(
            f"parents {[p.arm for p in parents]}: no LoRA factors in their {ADAPTER_WEIGHTS}"
        )
    r = rank or max(m.rank for m in modules.values())
    errors: dict[str, float] | None = {} if rank else None
    entries = []
    for m in modules.values():
        entries += svd_entries(m, r, reader, errors) if rank else concat_entries(m, r, reader)
    entries += [whole_entry(w, base, reader) for w in wholes.values()]
    return {
        "entries": entries,
        "config": adapter_config(parents, modules, base, r),
        "rank": r,
        "errors": errors,
        "representation": f"svd rank {r}" if rank else f"concatenated rank {r}",
    }


def write_adapter(plan: dict, tmp: Path, recycle: Callable) -> None:
    write_safetensors(tmp / ADAPTER_WEIGHTS, plan["entries"], recycle)
    io.write_json(tmp / ADAPTER_CONFIG, plan["config"])


# ---------------------------------------------------------------- full weights


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
    """Shards named as transformers' save_pretrained names them, an index when there are several."""
    shards = shard(plan["entries"], shard_bytes)
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
    for name in ("config.json", "generation_config.json"):
        if (first.dir / name).exists():
            shutil.copyfile(first.dir / name, tmp / name)


# ---------------------------------------------------------------- the merge


def check_args(arm: str, rank: int | None, shard_bytes: int) -> None:
    if not arm or "/" in arm:
        raise MergeError(f"arm {arm!r}: an arm id is a non-empty name without '/'")
    if rank is not None and (not isinstance(rank, int) or rank < 1):
        raise MergeError(
            f"rank {rank!r}: the SVD rank must be a positive integer (or None: concatenated)"
        )
    if not isinstance(shard_bytes, int) or shard_bytes < 1:
        raise MergeError(f"shard_bytes {shard_bytes!r}: must be a positive integer")


def merge(
    parents: list[tuple[str, str, float]],
    base_model: str,
    out: str,
    arm: str,
    rank: int | None = None,
    shard_bytes: int = 2**31,
) -> dict:
    """Write arm `arm` = base + sum_i w_i (P_i - base) into `out`; return its evidence.

    parents: (arm id, run directory, weight w_i); rank: truncate a LoRA merge to this rank by SVD
    (default: the exact concatenated rank); shard_bytes: the shard size of a full-weight output."""
    t0 = time.perf_counter()
    out = Path(out)
    check_args(arm, rank, shard_bytes)
    used, dropped = parse_parents(parents, out)
    kind = check_kinds(used)
    if rank is not None and kind == "full":
        raise MergeError(
            f"rank {rank}: an SVD rank applies to LoRA parents, "
            f"{[p.arm for p in used]} hold full weights"
        )
    base = load_base(base_model)
    t = time.perf_counter()
    verify(used, arm)
    t_verify = time.perf_counter() - t
    for p in used:
        load_parent(p)
    reader = Reader()
    try:
        plan = (
            plan_adapter(used, base, reader, rank)
            if kind == "adapter"
            else plan_full(used, base, reader)
        )
        with io.atomic_dir(out) as tmp:
            if kind == "adapter":
                write_adapter(plan, tmp, reader.blocks.recycle)
            else:
                write_full(plan, tmp, used[0], shard_bytes, reader.blocks.recycle)
            ev = evidence(
                arm, parents, used, dropped, kind, plan, base_model, reader, tmp, t0, t_verify
            )
            io.write_json(tmp / EVIDENCE, ev)
            params = {
                "method": "linear",
                "weights": ev["weights"],
                "parents": {a: str(d) for a, d, _ in parents},
                "base_model": str(base_model),
                "rank": rank,
                "shard_bytes": shard_bytes,
            }
            manifest.write(tmp, params=params, extra={"arm": arm, "kind": "merge"})
    finally:
        reader.close()
    return ev


def evidence(arm, given, used, dropped, kind, plan, base_model, reader, tmp, t0, t_verify) -> dict:
    errors = plan["errors"]
    wall = time.perf_counter() - t0
    return {
        "arm": arm,
        "method": "linear",
        "weights": {a: float(w) for a, _, w in given},
        "dropped_zero_weight": dropped,
        "parents": [
            {
                "arm": p.arm,
                "dir": str(p.dir),
                "weight": p.weight,
                "manifest_digest": p.record["digest"],
                "files_sha256": {f: p.record["files"][f]["sha256"] for f in parent_files_read(p)},
            }
            for p in used
        ],
        "output": kind,
        "representation": plan["representation"],
        "rank": plan["rank"],
        "reconstruction_error": None
        if errors is None
        else {
            "max_rel_fro": max(errors.values(), default=0.0),
            "per_module": dict(sorted(errors.items())),
        },
        "base_model": str(base_model),
        "bytes_read": reader.bytes_read,
        "bytes_written": sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()),
        "wall_time_s": round(wall, 4),
        "phases_s": {"verify_parents": round(t_verify, 4), "merge": round(wall - t_verify, 4)},
        "code": manifest.code_version(),
    }


def parent_files_read(p: Parent) -> list[str]:
    """The parent's files this merge read: its config, weight index and weights."""
    names = (
        [ADAPTER_CONFIG]
        if p.kind == "adapter"
        else ["config.json", "generation_config.json", FULL_INDEX]
    )
    return [f for f in [*names, *p.files] if f in p.record["files"]]


def dose(from_: tuple[str, str], to: tuple[str, str], alpha: float) -> list[tuple[str, str, float]]:
    """The parents of the dose x = from + alpha (to - from): weights 1 - alpha and alpha."""
    return [(from_[0], from_[1], 1.0 - alpha), (to[0], to[1], float(alpha))]


# ---------------------------------------------------------------- command line


def parent_arg(text: str) -> tuple[str, str, float]:
    arm, eq, rest = text.partition("=")
    d, colon, w = rest.rpartition(":")
    if not (eq and colon and arm and d and w):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected ARM=DIR:WEIGHT, e.g. B3=runs/B3/final:0.5"
        )
    try:
        return arm, d, float(w)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: weight {w!r} is not a number") from None


def bytes_arg(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    try:
        n = (
            int(float(text[:-1]) * units[text[-1].upper()])
            if text[-1:].upper() in units
            else int(text)
        )
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected bytes, e.g. 2147483648 or 2G"
        ) from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be positive")
    return n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m arenaflow.merge.build", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--arm", required=True, help="the merged arm's id")
    ap.add_argument(
        "--parent",
        type=parent_arg,
        action="append",
        required=True,
        help="ARM=DIR:WEIGHT, once per parent; WEIGHT any real number",
    )
    ap.add_argument(
        "--base-model", required=True, help="the base model directory every parent is a delta from"
    )
    ap.add_argument(
        "--rank", type=int, default=None, help="truncate a LoRA merge to this rank by SVD"
    )
    ap.add_argument(
        "--shard-bytes", type=bytes_arg, default=2**31, help="full-weight shard size (e.g. 2G)"
    )
    ap.add_argument("--out", required=True, help="output run directory")
    args = ap.parse_args(argv)
    try:
        ev = merge(
            args.parent,
            args.base_model,
            args.out,
            args.arm,
            rank=args.rank,
            shard_bytes=args.shard_bytes,
        )
    except (MergeError, manifest.ManifestError) as e:
        raise SystemExit(f"merge {args.arm}: {e}") from None
    keep = (
        "arm",
        "weights",
        "output",
        "representation",
        "rank",
        "bytes_read",
        "bytes_written",
        "wall_time_s",
    )
    print(json.dumps({k: ev[k] for k in keep} | {"out": args.out}, indent=2))


if __name__ == "__main__":
    main()
