"""Finished batches of a decoding job (sampling, a readout), kept beside its output so that a
rerun after a kill decodes only the batches it lacks.

generate() (arenaflow.decode.sampling) given a Job writes each batch it decodes, as soon as it
is decoded, to `<dir>/.<output name>.parts/part-<batch>-<sha256>.jsonl` (a line per prompt: its
samples), atomically, its sha256 in its name. The directory's job.json records what decides the
samples: the rendered prompts' digest, the decoding, k, seed, batch size, the engine settings,
the weights (Job.weights) and the code's version. A rerun of the same job reuses every part
whose bytes match its sha256 and decodes the rest; parts of another job (another seed,
temperature, pool, adapter...) are discarded whole, a part that fails its sha256 (corrupt,
truncated) alone; both with a line on stderr. A batch's samples depend only on its prompts and
seed + its index (generate()), and a rerun cuts the same batches, so the output merged from
parts is the uninterrupted job's, byte for byte. The caller removes the directory (finish())
once the output is written; Snakemake neither declares nor cleans it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

from arenaflow import engine, io, manifest

JOB_RECORD = "job.json"
PART = re.compile(r"part-(\d{6})-([0-9a-f]{64})\.jsonl")


@dataclasses.dataclass(frozen=True)
class Job:
    """Where a job's output goes and what identifies the weights it decodes with (weights_of)."""

    out: Path
    weights: dict


def parts_dir(out: str | Path) -> Path:
    """candidates/C/samples.jsonl -> candidates/C/.samples.jsonl.parts"""
    out = Path(out)
    return out.parent / f".{out.name}.parts"


def weights_of(base: str | Path, adapter: str | Path | None) -> dict:
    """The weights a job decodes with: the arm's manifest digest (its files were verified
    against it when the policy was loaded) and the base's files by name, size and mtime (hashing
    a base's gigabytes at every start would cost more than the batches a resume saves)."""
    files = sorted(p for p in Path(base).iterdir() if p.is_file())
    stamp = "".join(f"{p.name}\t{p.stat().st_size}\t{p.stat().st_mtime_ns}\n" for p in files)
    arm = None
    if adapter is not None:
        arm = io.read_json(Path(adapter) / manifest.MANIFEST)["digest"]
    return {"base": str(base), "base_files": manifest.sha256_text(stamp), "arm": arm}


def identity(job: Job, prompts: list[str], decoding, k: int, seed: int, batch_size: int) -> dict:
    """What decides a job's samples, as JSON reads it back."""
    record = {
        "prompts_sha256": manifest.sha256_text(json.dumps(prompts, ensure_ascii=False)),
        "prompts": len(prompts),
        "decoding": dataclasses.asdict(decoding),
        "k": k,
        "seed": seed,
        "batch_size": batch_size,
        "engine": engine.settings(),
        "weights": job.weights,
        "code": manifest.code_version(),
    }
    return json.loads(json.dumps(record))


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Parts:
    """The verified parts of one job (open() discards those of another job or a bad hash)."""

    def __init__(self, out: str | Path, record: dict):
        self.dir, self.record = parts_dir(out), record
        self.kept = self._open()

    def _open(self) -> dict[int, Path]:
        if self.dir.exists() and self._recorded() != self.record:
            _say(f"{self.dir}: parts of another job (its {JOB_RECORD} differs): discarded")
            shutil.rmtree(self.dir)
        if not self.dir.exists():
            io.write_json(self.dir / JOB_RECORD, self.record)
        kept = {}
        for p in sorted(self.dir.glob("part-*.jsonl")):
            m = PART.fullmatch(p.name)
            if m is None or manifest.sha256_file(p) != m[2]:
                _say(f"{p}: does not match the sha256 in its name: discarded, decoded again")
                p.unlink()
                continue
            kept[int(m[1])] = p
        if kept:
            _say(f"{self.dir}: resuming with {len(kept)} finished batch(es) {sorted(kept)}")
        return kept

    def _recorded(self) -> dict | None:
        try:
            return io.read_json(self.dir / JOB_RECORD)
        except (OSError, ValueError):  # missing or half-written by a job killed at its start
            return None

    def get(self, batch: int, prompts: int) -> list[list[dict]] | None:
        """Batch `batch`'s samples per prompt, if a part holds them for its `prompts` prompts."""
        path = self.kept.get(batch)
        if path is None:
            return None
        rows = io.read_jsonl(path)
        if len(rows) != prompts:  # its hash held, yet not this batch's: decoded again
            _say(f"{path}: {len(rows)} prompts, batch {batch} has {prompts}: decoded again")
            return None
        return [r["samples"] for r in rows]

    def put(self, batch: int, samples: list[list[dict]]) -> None:
        """Batch `batch`'s samples per prompt, written whole under their sha256."""
        text = "".join(
            json.dumps({"samples": s}, sort_keys=True, ensure_ascii=False) + "\n" for s in samples
        )
        io.write_text(self.dir / f"part-{batch:06d}-{manifest.sha256_text(text)}.jsonl", text)


def finish(out: str | Path) -> None:
    """Drop a job's parts once its output is written."""
    shutil.rmtree(parts_dir(out), ignore_errors=True)
