"""LoRA parents merged into one adapter: sum_i w_i s_i B_i A_i as concatenated factors.

Consumes the parents' adapter_config.json and factor headers; plans the output tensors (exact
concatenation, or an SVD truncation to a given rank) and writes adapter_model.safetensors and
adapter_config.json. The arithmetic is explained in arenaflow.merge.build's docstring.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from arenaflow import io
from arenaflow.merge.parents import Base, MergeError, Parent, base_terms
from arenaflow.merge.stream import Entry, Reader, Src, combine, write_safetensors
from arenaflow.models import ADAPTER_CONFIG, ADAPTER_WEIGHTS

PREFIX = "base_model.model."  # PEFT's prefix on every key of a LoRA adapter file
FACTOR = {
    "lora_A.weight": "A",
    "lora_B.weight": "B",
    "lora_embedding_A": "A",
    "lora_embedding_B": "B",
}
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


def grows_rows(base: Src, t: Src) -> bool:
    """Whether `t` is `base` with rows appended: a vocabulary tensor of a tokenizer that grew."""
    return len(t.shape) == 2 and t.shape[1:] == base.shape[1:] and t.shape[0] > base.shape[0]


def add_whole(
    p: Parent, base: Base, wholes: dict[str, Whole], base_key: str, key: str, grow: bool = False
) -> None:
    """grow: a copy with more rows than the base's is allowed (it replaces the base's whole)."""
    t = p.index[key]
    w = wholes.setdefault(base_key, Whole(key, base_key, t.shape, t.dtype))
    if t.shape != w.shape:
        raise MergeError(
            f"parent {p.arm}: tensor {key} has shape {list(t.shape)}, "
            f"parent {w.parts[0][2]}'s {list(w.shape)}"
        )
    src = base.index.get(base_key)  # a tied head is checked in base_terms, if the base is needed
    if src is not None and src.shape != t.shape and not (grow and grows_rows(src, t)):
        raise MergeError(
            f"parent {p.arm}: tensor {key} has shape {list(t.shape)}, the base's "
            f"{src.key} {list(src.shape)} (base model {base.path})"
        )
    w.parts.append((p.weight, t, p.arm))


def collect(
    parents: list[Parent], base: Base, grow: bool = False
) -> tuple[dict[str, Module], dict[str, Whole]]:
    """grow (one adapter folded): modules_to_save copies may have more rows than the base's."""
    modules, wholes = {}, {}
    if len({bool(p.config.get("fan_in_fan_out")) for p in parents}) > 1:
        raise MergeError(f"parents {[p.arm for p in parents]} disagree on fan_in_fan_out")
    for p in parents:
        check_adapter_config(p)
        factors, whole = split_keys(p)
        for name, ab in factors.items():
            add_module(p, base, modules, name, ab)
        for base_key, key in whole.items():
            add_whole(p, base, wholes, base_key, key, grow)
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
