"""A LoRA adapter folded into its base: full weights a server loads without PEFT.

    python -m arenaflow.merge.fold --adapter bundles/B3f --base-model models/tiny-arith \\
        --out bundles/B3f/merged [--shard-bytes 2G]

Every base tensor is written once, in the base's dtype, in shards named as save_pretrained
names them: an adapted module's weight as W + sum_j s_j B_j A_j (computed in float32 per row
block, rounded once), a modules_to_save tensor as the adapter's copy, every other tensor as the
base's, byte for byte. Where the base ties its head to its input embedding and the adapter makes
the two differ (lm_head in modules_to_save, or LoRA on the embedding), the head is written out
and config.json unties it, as PEFT served them: PEFT's head copy leaves the embedding as the
base's, and PEFT's embedding LoRA leaves a tied head on the base's embedding. Where the
adapter's tokenizer grew (a chat template's tokens installed, models.fit_embeddings), its
modules_to_save copies of the embedding and head have more rows than the base's: they replace
the base's, and config.json's vocab_size becomes their row count. A vocabulary tensor the adapter
does not carry is refused then (its new rows were random, PEFT's resize, and are not saved).

Streaming as arenaflow.merge.build: tensors are read through safetensors.safe_open in row blocks
and written by a writer that lays the header out first, so neither the base nor the output is
ever whole in memory. The adapter's config is checked by arenaflow.merge.lora (plain LoRA and
modules_to_save only); bad input raises MergeError naming the tensor.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from arenaflow import io
from arenaflow.merge.build import bytes_arg
from arenaflow.merge.full import write_shards
from arenaflow.merge.lora import Module, collect, grows_rows
from arenaflow.merge.parents import Base, MergeError, Parent, load_base, load_parent, tied_keys
from arenaflow.merge.stream import Entry, Reader, Src, combine, row_ranges

SHARD_BYTES = 2**31


def folded(m: Module, src: Src, reader: Reader, transposed: bool) -> Iterator[torch.Tensor]:
    """Rows of W + sum_j c_j B_j A_j (an embedding's and a fan_in_fan_out layer's delta is
    (B A)^T, as PEFT stores their factors)."""
    parts = [
        (c, reader.rows(a).view(a.shape).float(), reader.rows(b).view(b.shape).float())
        for c, a, b in m.parts
    ]
    for r0, r1 in row_ranges(src.shape, 4):
        r0, r1 = r0 or 0, src.shape[0] if r1 is None else r1
        # a copy: rows() is a view on the file's mapped pages, which a later read must find
        # unchanged (a tied head reads the embedding again)
        w = reader.rows(src, r0, r1).view(r1 - r0, *src.shape[1:]).to(torch.float32, copy=True)
        for c, a, b in parts:
            delta = a[:, r0:r1].T @ b.T if transposed else b[r0:r1] @ a
            w.add_(delta, alpha=c)
        yield w.to(src.dtype).reshape(-1)


def grown_rows(p: Parent, entries: list[Entry], base: Base) -> int | None:
    """The merged vocabulary's row count where the adapter's copies grew it, else None."""
    grown = {e.name: e.shape for e in entries if e.shape != base.src(e.name).shape}
    if not grown:
        return None
    if len({s[0] for s in grown.values()}) > 1:
        raise MergeError(f"adapter {p.dir}: its tensors grow the vocabulary unevenly: {grown}")
    (key, shape), *_ = grown.items()
    old = base.src(key).shape
    left = [e.name for e in entries if e.name not in grown and e.shape == old]
    if left:
        raise MergeError(
            f"adapter {p.dir}: tensor {key} grows the vocabulary from {old[0]} to {shape[0]} "
            f"rows, but the adapter carries no copy of {left} (modules_to_save), whose new "
            "rows the fold cannot know"
        )
    return shape[0]


def plan_fold(p: Parent, base: Base, reader: Reader) -> tuple[list[Entry], bool, int]:
    """(the merged model's tensors, whether its head must be untied from its embedding, the
    modules folded)."""
    modules, wholes = collect([p], base, grow=True)
    transposed = bool(p.config.get("fan_in_fan_out"))
    changed = {f"{n}.weight" for n in modules} | set(wholes)
    tied = {h: e for h, e in tied_keys(base.path).items() if h in changed or e in changed}
    entries = []
    for key in [*sorted(base.index), *sorted(set(tied) - set(base.index))]:
        src = base.src(key)
        name = key.removesuffix(".weight")
        if name in modules:
            m = modules[name]
            t = transposed or "embedding" in m.a_key
            entries.append(
                Entry(key, src.dtype, src.shape, lambda m=m, s=src, t=t: folded(m, s, reader, t))
            )
            continue
        # a modules_to_save copy replaces the base's tensor, grown rows included
        terms = [(1.0, wholes[key].parts[0][1] if key in wholes else src)]
        shape = terms[0][1].shape
        if shape != src.shape and not grows_rows(src, terms[0][1]):  # a tied head's base
            raise MergeError(
                f"adapter {p.dir}: tensor {terms[0][1].key} has shape {list(shape)}, the "
                f"base's {src.key} {list(src.shape)} (base model {base.path})"
            )
        entries.append(
            Entry(key, src.dtype, shape, lambda t=terms, d=src.dtype: combine(reader, t, d))
        )
    return entries, bool(tied), len(modules)


def fold(adapter_dir: str | Path, base_model: str | Path, out: str | Path, shard_bytes=SHARD_BYTES):
    """Write base + adapter into `out` (which must not exist yet; the caller's temporary
    directory makes it atomic): shards, config.json, the base's generation_config.json.
    Returns {"tensors", "folded_modules", "untied_head"}."""
    out = Path(out)
    p = Parent("adapter", Path(adapter_dir), 1.0, kind="adapter")
    base = load_base(str(base_model))
    load_parent(p)
    if p.config.get("peft_type") != "LORA":
        raise MergeError(f"{adapter_dir}: peft_type {p.config.get('peft_type')!r} is not LoRA")
    reader = Reader()
    try:
        entries, untie, n_folded = plan_fold(p, base, reader)
        rows = grown_rows(p, entries, base)
        out.mkdir(parents=True)
        write_shards(entries, out, shard_bytes, reader.blocks.recycle)
    finally:
        reader.close()
    cfg = io.read_json(base.path / "config.json")
    if untie:
        cfg["tie_word_embeddings"] = False
    if rows is not None:
        text = cfg.get("text_config") or {}
        (text if "vocab_size" in text else cfg)["vocab_size"] = rows
    io.write_json(out / "config.json", cfg)
    if (base.path / "generation_config.json").exists():
        shutil.copyfile(base.path / "generation_config.json", out / "generation_config.json")
    return {
        "tensors": len(entries),
        "folded_modules": n_folded,
        "untied_head": untie,
        "grown_vocab_size": rows,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m arenaflow.merge.fold", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--adapter", required=True, help="a PEFT LoRA adapter directory")
    ap.add_argument("--base-model", required=True, help="the base model directory it adapts")
    ap.add_argument("--out", required=True, help="the merged model's directory (must not exist)")
    ap.add_argument("--shard-bytes", type=bytes_arg, default=SHARD_BYTES, help="shard size")
    args = ap.parse_args(argv)
    try:
        print(fold(args.adapter, args.base_model, args.out, args.shard_bytes))
    except MergeError as e:
        raise SystemExit(f"fold {args.adapter}: {e}") from None


if __name__ == "__main__":
    main()
