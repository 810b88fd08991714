"""A merge's inputs: its parents (ARM, run directory, weight) and the base model.

Parses and checks the parent list, verifies each parent against its manifest, and indexes the
parents' and the base's weight files from their headers only (no tensor is read); base_terms
gives the base's tensor where the formula needs it. Bad input raises MergeError.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from arenaflow import io, manifest
from arenaflow.merge.stream import BASE_EPS, ST_DTYPES, Src
from arenaflow.models import ADAPTER_CONFIG, ADAPTER_WEIGHTS

FULL_INDEX = "model.safetensors.index.json"


class MergeError(ValueError):
    """Bad merge input; the message names the parent and tensor at fault."""


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
