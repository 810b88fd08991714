"""Weight-space merges as arms: model soups and dose-line interpolation.

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
alpha) gives the parents of a dose. Bad input raises MergeError (arenaflow.merge.parents, a
ValueError) naming the parent and tensor; a parent whose manifest does not verify,
manifest.ManifestError naming the parent.

Streaming: every parent is verified against its manifest (sha256, in threads) before anything of
it is read; then tensors are read through safetensors.safe_open in row blocks of BLOCK_BYTES and
written by a safetensors writer that lays the header out first, so neither a parent nor an output
shard is ever whole in memory (peak: a few blocks per parent plus recycled output blocks). The
arithmetic is float32, rounded once to the parents' dtype (two terms whose coefficients sum to 1,
the usual soup or dose, go through torch.lerp: one pass instead of four). Output: the weights,
adapter_config.json (or config.json), merge_evidence.json and manifest.json, all through
io.atomic_dir: a failed merge leaves no output directory.

This module is the command line and the merge's order of work; arenaflow.merge.parents reads and
checks the inputs, arenaflow.merge.lora and arenaflow.merge.full plan the output tensors, and
arenaflow.merge.stream reads, combines and writes them (BLOCK_BYTES and the writer are there).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from arenaflow import io, manifest
from arenaflow.merge.full import plan_full, write_full
from arenaflow.merge.lora import plan_adapter, write_adapter
from arenaflow.merge.parents import (
    FULL_INDEX,
    MergeError,
    Parent,
    check_kinds,
    load_base,
    load_parent,
    parse_parents,
    verify,
)
from arenaflow.merge.stream import Reader
from arenaflow.models import ADAPTER_CONFIG

EVIDENCE = "merge_evidence.json"


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
            manifest.write(tmp, params=params, extra={"arm": arm, "kind": "merge"}, written_as=out)
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
