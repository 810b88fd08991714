"""Resumable checkpoints, at the same or another world size.

A run is identified by its fingerprint: the hyperparameters that change the optimisation, with
the batch layout (rows per micro-batch, accumulation, ranks) reduced to the global batch, plus
the corpus digest, the init and the base revision. Resources (runtime, memory, checkpoint
cadence) are not part of it. So a run checkpointed on 2 GPUs resumes on 1 (with twice the
accumulation) and the other way round: DeepSpeed's ZeRO-3 shards are laid out per rank, so the
checkpoint is first converted to DeepSpeed's world-size-free *universal* format
(`deepspeed.checkpoint.ds_to_universal`) and loaded with `checkpoint.load_universal`.
A checkpoint of another configuration is discarded; one that differs only in its global batch
because the world size changed is refused, with the numbers, since discarding it would silently
throw away the run's progress.

Every checkpoint directory carries a sha256 manifest (arenaflow.manifest) recording its tag,
step, world size, ZeRO stage and the run's identity and fingerprint. Rank 0 writes it once every
rank has written its shards, and `fingerprint.json`, which names the checkpoint to resume, only
after it: a checkpoint without its manifest is incomplete, and the run starts over as it does
when `fingerprint.json` is missing. Before DeepSpeed reads anything (the universal conversion
included), rank 0 verifies the planned checkpoint and every rank receives the outcome: a file
that differs from the manifest (a flipped bit, a shard copied from another step), or a manifest
of another step or run, stops the job with a ManifestError naming the file. The job is refused,
never restarted from step 0, so the checkpoint is kept for inspection; deleting the checkpoints
directory starts the run over. A universal conversion carries its own manifest, naming the
manifest digest of the checkpoint it was converted from: a conversion of other contents is
redone, one whose files changed is refused like the checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from arenaflow import io, manifest

log = logging.getLogger("arenaflow.train")
META = "fingerprint.json"
# Keys that decide where and how fast the run goes, not what it computes.
LAYOUT_KEYS = (
    "micro_batch_size",
    "grad_accum",
    "nproc",
    "nodes",
    "runtime_min",
    "mem_mb",
    "checkpoint_every",
    "zero_stage",  # how the state is laid out on the ranks, not what is computed
)


def identity(hyper: dict, corpus_digest: str, init: str, base_rev: str, world: int) -> dict:
    run = {k: v for k, v in sorted(hyper.items()) if k not in LAYOUT_KEYS}
    run["global_batch"] = hyper["micro_batch_size"] * hyper["grad_accum"] * world
    run["corpus"] = corpus_digest
    run["init"] = "base" if init == "base" else manifest.verify(init)["digest"]
    run["base_revision"] = base_rev
    return run


def fingerprint(run: dict) -> str:
    return manifest.sha256_text(json.dumps(run, sort_keys=True, default=str))


@dataclass
class Plan:
    tag: str | None = None  # the checkpoint to resume; None: start from step 0
    universal: bool = False  # it was written at another world size or ZeRO stage
    ranks: int = 1  # the world size and ZeRO stage it was written at
    stage: int = 3
    digest: str | None = None  # its manifest's digest, verified by plan()


def plan(ckpt_dir: Path, run: dict, world: int, stage: int) -> Plan:
    """What to resume, decided before DeepSpeed starts (universal loading is an engine setting).
    Every rank reads the same files and comes to the same answer."""
    if not (ckpt_dir / "latest").exists():
        return Plan()
    if not (ckpt_dir / META).exists():
        log.warning(
            "%s: no %s beside `latest` (killed while saving); starting over", ckpt_dir, META
        )
        return Plan()
    meta = io.read_json(ckpt_dir / META)
    old = meta.get("run", {})
    differ = sorted(k for k in old.keys() | run.keys() if old.get(k) != run.get(k))
    if differ == ["global_batch"] and meta.get("world_size") != world:
        b = old["global_batch"]
        raise SystemExit(
            f"{ckpt_dir}: checkpoint {meta['tag']} was written by {meta['world_size']} ranks "
            f"with a global batch of {b} rows; "
            f"this run has {world} ranks and a global batch of {run['global_batch']}. "
            f"To resume, set micro_batch_size x grad_accum = {b / world:g} per rank; "
            f"to start over, delete {ckpt_dir}."
        )
    if meta.get("fingerprint") != fingerprint(run):
        log.info(
            "discarding checkpoints in %s: they belong to another configuration (%s differ)",
            ckpt_dir,
            ", ".join(differ) or "fingerprint",
        )
        discard(ckpt_dir)
        return Plan()
    written = meta.get("zero_stage", 3)  # absent: written before zero_stage existed, at 3
    if not (ckpt_dir / meta["tag"] / manifest.MANIFEST).exists():
        log.warning(
            "%s: no %s (killed while saving, or written before checkpoints had manifests); "
            "starting over",
            ckpt_dir / meta["tag"],
            manifest.MANIFEST,
        )
        return Plan()
    digest = on_rank0(lambda: check(ckpt_dir, meta, run), world)
    universal = meta["world_size"] != world or written != stage
    return Plan(meta["tag"], universal, meta["world_size"], written, digest)


def record(tag: str, step: int, run: dict, world: int, stage: int) -> dict:
    """What a checkpoint's manifest says it is, beside its files."""
    return {
        "tag": tag,
        "step": step,
        "fingerprint": fingerprint(run),
        "world_size": world,
        "zero_stage": stage,
    }


def refused(where: Path, ckpt_dir: Path, e: manifest.ManifestError) -> manifest.ManifestError:
    return manifest.ManifestError(
        f"resume refused {where}: {e}; the job stops rather than load it or start over: "
        f"delete {ckpt_dir} to train from step 0"
    )


def check(ckpt_dir: Path, meta: dict, run: dict) -> str:
    """The digest of checkpoint meta["tag"]'s manifest, once its files match it and it records
    the checkpoint that `fingerprint.json` (meta) names, of this run; else a ManifestError
    naming the file."""
    where = ckpt_dir / meta["tag"]
    try:
        rec = manifest.verify(where)
        step = meta["tag"].removeprefix("step_")  # the tag save() gave it; anything else: None
        step = int(step) if step.isdigit() else None
        want = record(meta["tag"], step, run, meta["world_size"], meta.get("zero_stage", 3))
        got = {k: rec.get("checkpoint", {}).get(k) for k in want}
        if got != want:
            odd = ", ".join(f"{k} {got[k]} (expected {want[k]})" for k in want if got[k] != want[k])
            raise manifest.ManifestError(
                f"{where / manifest.MANIFEST}: records {odd}, against {ckpt_dir / META} and this "
                "run (a checkpoint copied from another step or run)"
            )
    except manifest.ManifestError as e:
        raise refused(where, ckpt_dir, e) from None
    return rec["digest"]


def on_rank0(fn, world: int):
    """fn() computed by rank 0 alone, returned on every rank; its ManifestError or SystemExit is
    raised on every rank, so no rank waits at a collective for one that stopped, and every
    rank's log names the file."""
    box = [None, None]
    if int(os.environ["RANK"]) == 0:
        try:
            box[0] = fn()
        except (manifest.ManifestError, SystemExit) as e:
            box[1] = e
    if world > 1:  # also the other ranks' wait for rank 0
        torch.distributed.broadcast_object_list(box, src=0)
    if box[1] is not None:
        raise box[1]
    return box[0]


def discard(ckpt_dir: Path) -> None:
    torch.distributed.barrier()
    if int(os.environ["RANK"]) == 0:
        shutil.rmtree(ckpt_dir)
    torch.distributed.barrier()


def to_universal(ckpt_dir: Path, p: Plan, world: int, stage: int) -> None:
    """Rank 0 converts checkpoint p.tag to the universal format once (kept if already done), to
    resume it on `world` ranks at ZeRO `stage`; all ranks wait."""
    on_rank0(lambda: universal_of(ckpt_dir, p, world, stage), world)


def universal_of(ckpt_dir: Path, p: Plan, world: int, stage: int) -> None:
    done = ckpt_dir / f"{p.tag}_universal"
    if done.is_dir() and converted_from(done) == p.digest:
        try:
            manifest.verify(done)
        except manifest.ManifestError as e:
            raise refused(done, ckpt_dir, e) from None
        return
    # absent, or converted from other contents of the tag (a run that started over): redone
    # from the checkpoint just verified
    shutil.rmtree(done, ignore_errors=True)
    tmp = ckpt_dir / f".{p.tag}_universal.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        convert(ckpt_dir / p.tag, tmp)
    except (RuntimeError, KeyError, OSError, StopIteration) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(
            f"{ckpt_dir / p.tag}: could not convert this checkpoint, written by {p.ranks} ranks "
            f"at ZeRO stage {p.stage}, to DeepSpeed's universal format to resume it on "
            f"{world} ranks at stage {stage} (zero_stage resolves to 2 on one rank, 3 on "
            f"several); set zero_stage: {p.stage} to keep its stage, or delete {ckpt_dir} to "
            f"start over:\n{e!r}"
        ) from None
    manifest.write(tmp, extra={"checkpoint": {"tag": p.tag, "converted_from": p.digest}})
    tmp.rename(done)
    log.info(
        "converted %s to the universal format for %d ranks at ZeRO stage %d",
        ckpt_dir / p.tag,
        world,
        stage,
    )


def converted_from(universal: Path) -> str | None:
    """The manifest digest of the checkpoint `universal` was converted from (None: unknown)."""
    try:  # an unreadable manifest: unknown too, and the conversion is redone
        return io.read_json(universal / manifest.MANIFEST)["checkpoint"]["converted_from"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def convert(source: Path, out: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(source),
            "--output_folder",
            str(out),
            "--num_extract_workers",
            "2",
            "--num_merge_workers",
            "1",
            # A ZeRO-1/2 checkpoint (a one-rank job's, zero_stage: auto) lacks the
            # version record Megatron-DeepSpeed adds; ZeRO-3's conversion ignores it.
            "--inject_missing_state",
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    name_both_stages(out)


def name_both_stages(universal: Path) -> None:
    """Make a universal checkpoint loadable at ZeRO stage 2 and 3 alike (zero_stage: auto runs a
    one-rank job at 2, several ranks at 3). Its weights and Adam moments (zero/<param>/) hold
    the same numbers whichever stage wrote them; DeepSpeed 0.19's two loaders want them laid
    out differently, and this fills in, from what is there, what the other stage's loader reads.
    The metadata file (steps, LR schedule, client state) is named
    zero_pp_rank_0_mp_rank_XX_model_states.pt by ZeRO-3, mp_rank_XX_model_states.pt by ZeRO-1/2:
    each is linked to the other name."""
    meta = None
    for f in sorted(universal.glob("*mp_rank_*_model_states.pt")):
        mp = f.name.split("mp_rank_")[1]
        other = (
            "mp_rank_" + mp if f.name.startswith("zero_pp_rank_") else "zero_pp_rank_0_" + f.name
        )
        if not (universal / other).exists():
            os.link(f, universal / other)
        meta = f
    state = universal / "zero/optimizer_state.pt"
    sd = torch.load(state, weights_only=False)
    if "optimizer_state_dict" not in sd:  # from ZeRO-1/2
        # ZeRO-3 reads the Adam step and param groups from optimizer_state_dict
        step = torch.load(next(universal.glob("zero/*/step.pt")), weights_only=False)
        sd["optimizer_state_dict"] = {
            "state": {0: {"step": step}},
            "param_groups": sd["param_groups"],
        }
    else:  # from ZeRO-3
        meta = torch.load(meta, weights_only=False)
        sd.setdefault("ds_version", meta["ds_version"])
        shapes = {k: v for group in meta["param_shapes"] for k, v in group.items()}
        zero3_to_zero12(universal / "zero", shapes, sd["optimizer_state_dict"]["state"][0]["step"])
    torch.save(sd, state)


def zero3_to_zero12(zero: Path, shapes: dict, step) -> None:
    """ZeRO-1/2 read each parameter's fp32 weight and Adam moments as {"param": tensor of the
    parameter's shape} and its Adam step from step.pt; ZeRO-3 writes flat tensors and keeps
    the step in optimizer_state.pt (its loader takes both forms)."""
    for name, shape in shapes.items():
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            f = zero / name / f"{key}.pt"
            t = torch.load(f, weights_only=False)
            if torch.is_tensor(t):
                torch.save({"param": t.view(shape)}, f)
        if not (zero / name / "step.pt").exists():
            torch.save(step, zero / name / "step.pt")


def resume(engine, ckpt_dir: Path, p: Plan) -> tuple[int, list]:
    """(step, metrics so far) from the planned checkpoint, or (0, []). plan() verified the
    checkpoint and to_universal() its conversion: nothing is loaded unverified."""
    if p.tag is None:
        return 0, []
    groups = [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups]
    _, client = engine.load_checkpoint(
        str(ckpt_dir), tag=f"{p.tag}_universal" if p.universal else p.tag
    )
    if p.universal:
        # Two slips of DeepSpeed 0.19's universal ZeRO-3 loader, mended so the resumed run takes
        # the same steps as an uninterrupted one: it copies param group 0's settings (name, lr,
        # weight decay) onto every group, and gives every group one shared Adam step tensor,
        # which AdamW then increments once per group per step.
        for g, mine, lr in zip(
            engine.optimizer.param_groups, groups, engine.lr_scheduler.get_last_lr()
        ):
            g.update(mine, lr=lr)
        inner = engine.optimizer.optimizer
        on_device = any(
            g.get("fused") or g.get("capturable") for g in inner.param_groups
        )  # torch's rule
        for param, state in inner.state.items():  # ZeRO-3's flat fp32 partitions
            if torch.is_tensor(state.get("step")):
                state["step"] = (
                    state["step"].detach().clone().float().to(param.device if on_device else "cpu")
                )
    log.info(
        "resumed from %s at step %d%s",
        ckpt_dir / client["tag"],
        client["step"],
        " (universal checkpoint: another world size or ZeRO stage)" if p.universal else "",
    )
    return client["step"], client["metrics"]


def save(
    engine, ckpt_dir: Path, step: int, metrics: list, run: dict, world: int, stage: int
) -> None:
    tag = f"step_{step:06d}"
    rank0 = int(os.environ["RANK"]) == 0
    if rank0:  # a tag saved again (a run that started over) holds this save's files alone
        for old in (ckpt_dir / tag, ckpt_dir / f"{tag}_universal"):
            shutil.rmtree(old, ignore_errors=True)
    if world > 1:
        torch.distributed.barrier()
    engine.save_checkpoint(
        str(ckpt_dir), tag=tag, client_state={"step": step, "metrics": metrics, "tag": tag}
    )
    # The manifest lists the files on disk, so every rank's shards come first: ours, not a
    # detail of the DeepSpeed version's save (0.19's happens to end in a barrier)
    if world > 1:
        torch.distributed.barrier()
    if rank0:
        manifest.write(
            ckpt_dir / tag, params=run, extra={"checkpoint": record(tag, step, run, world, stage)}
        )
        io.write_json(  # after the manifest: it names a checkpoint only once that is complete
            ckpt_dir / META,
            {
                "fingerprint": fingerprint(run),
                "run": run,
                "world_size": world,
                "zero_stage": stage,
                "tag": tag,
            },
        )
    # DeepSpeed's own barrier comes before this file; without a second one a rank that exits
    # right after saving (a preemption, ARENAFLOW_FAIL_AFTER_STEP) can get rank 0 killed by the
    # launcher before the checkpoint is resumable.
    torch.distributed.barrier()
