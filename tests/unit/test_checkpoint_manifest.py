"""Checkpoint manifests: a resume loads only a checkpoint whose files match the sha256 manifest
rank 0 wrote once every rank had saved; anything else stops the job naming the file, and the
checkpoint is kept (the run is refused, not started over)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypers import TINY_ARM
from safetensors.torch import load_file
from test_faults import ENV, flip_bit, train_cmd

from arenaflow import io, knobs, manifest
from arenaflow.bases import tinymodel
from arenaflow.corpora import build as corpora
from arenaflow.pools import math as mathpool
from arenaflow.train import checkpoints
from arenaflow.train.dist import free_port

# the resume tier (with the resumes across world sizes): seven CPU trainings, ~2 min
pytestmark = pytest.mark.ranks

HYPER = {**TINY_ARM, "checkpoint_every": 2}  # 24 rows, 4 a step: 6 steps, checkpoints at 2, 4
SHARD = "zero_pp_rank_0_mp_rank_00_optim_states.pt"  # one rank's optimizer state (ZeRO-2)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus") / "corpora/c"
    rows = mathpool.generate(24, 7, "train", {"add": 1, "mul": 1}, "f")
    corpora.build(out, rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {})
    return out


def train(out: Path, corpus: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = train_cmd(out, corpus, "base", HYPER)
    env = {**ENV, **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def whole(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "runs/W/final"
    proc = train(out, corpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def killed(corpus, tmp_path_factory) -> Path:
    """The checkpoints of a run preempted after step 4: step_000002 and step_000004."""
    out = tmp_path_factory.mktemp("killed") / "runs/K/final"
    proc = train(out, corpus, {knobs.FAIL_AFTER_STEP: "4"})
    assert proc.returncode == 75, proc.stderr[-3000:]
    return out.parent / "checkpoints"


def copy_checkpoints(killed: Path, root: Path) -> Path:
    ckpt = root / "runs/A/checkpoints"
    shutil.copytree(killed, ckpt)
    return ckpt


def assert_refused(proc, ckpt: Path, file: str) -> None:
    """The job failed naming the file, loaded nothing, wrote no weights and kept the checkpoint."""
    assert proc.returncode != 0
    named = rf"ManifestError: resume refused \S*/checkpoints/step_000004: \S*/step_000004/{file}"
    assert re.search(named, proc.stderr), proc.stderr[-3000:]
    assert f"delete {ckpt} to train from step 0" in proc.stderr
    assert "resumed from" not in proc.stderr
    assert not (ckpt.parent / "final").exists()
    assert (ckpt / "step_000004" / SHARD).is_file() and (ckpt / checkpoints.META).is_file()


def test_a_bit_flipped_optimizer_shard_is_refused_naming_it(killed, corpus, tmp_path):
    ckpt = copy_checkpoints(killed, tmp_path)
    shard = ckpt / "step_000004" / SHARD
    flip_bit(shard, shard.stat().st_size // 2)
    proc = train(ckpt.parent / "final", corpus)
    assert_refused(proc, ckpt, re.escape(SHARD) + ": sha256")


def test_a_stale_optimizer_shard_from_another_step_is_refused_naming_it(killed, corpus, tmp_path):
    ckpt = copy_checkpoints(killed, tmp_path)
    stale, shard = ckpt / "step_000002" / SHARD, ckpt / "step_000004" / SHARD
    assert stale.read_bytes() != shard.read_bytes()  # two steps' Adam states
    shutil.copyfile(stale, shard)
    proc = train(ckpt.parent / "final", corpus)
    assert_refused(proc, ckpt, re.escape(SHARD) + ": sha256")


def test_an_intact_checkpoint_resumes_to_the_uninterrupted_runs_weights(
    killed, whole, corpus, tmp_path
):
    ckpt = copy_checkpoints(killed, tmp_path)
    meta = io.read_json(ckpt / checkpoints.META)
    rec = manifest.verify(ckpt / "step_000004")
    assert rec["checkpoint"] == {
        "tag": "step_000004",
        "step": 4,
        "fingerprint": meta["fingerprint"],
        "world_size": 1,
        "zero_stage": 2,
    }
    assert rec["params"] == meta["run"] and SHARD in rec["files"]
    proc = train(ckpt.parent / "final", corpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step_000004 at step 4" in proc.stderr
    out = ckpt.parent / "final"
    assert io.read_json(out / "training_evidence.json")["resumed_from_step"] == 4
    a, b = (load_file(d / "adapter_model.safetensors") for d in (whole, out))
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=1e-5)


def plan_of(ckpt: Path, monkeypatch) -> checkpoints.Plan:
    """plan() as rank 0 of the one-rank retry makes it (no collective on one rank)."""
    monkeypatch.setenv("RANK", "0")
    return checkpoints.plan(ckpt, io.read_json(ckpt / checkpoints.META)["run"], 1, 2)


def test_a_whole_checkpoint_copied_from_another_step_is_refused_naming_its_manifest(
    killed, tmp_path, monkeypatch
):
    ckpt = copy_checkpoints(killed, tmp_path)
    shutil.rmtree(ckpt / "step_000004")
    shutil.copytree(ckpt / "step_000002", ckpt / "step_000004")  # its own manifest verifies
    with pytest.raises(
        manifest.ManifestError,
        match=r"resume refused \S*/step_000004: \S*/step_000004/manifest\.json: records "
        r"tag step_000002 \(expected step_000004\), step 2 \(expected 4\)",
    ):
        plan_of(ckpt, monkeypatch)
    manifest.verify(ckpt / "step_000004")  # every file matches: only the record tells


def test_a_checkpoint_without_its_manifest_is_incomplete_and_the_run_starts_over(
    killed, tmp_path, monkeypatch, caplog
):
    ckpt = copy_checkpoints(killed, tmp_path)
    assert plan_of(ckpt, monkeypatch).tag == "step_000004"
    (ckpt / "step_000004" / manifest.MANIFEST).unlink()
    with caplog.at_level(logging.WARNING, logger="arenaflow.train"):
        assert plan_of(ckpt, monkeypatch) == checkpoints.Plan()
    assert "step_000004: no manifest.json" in caplog.text and "starting over" in caplog.text


def test_a_changed_universal_conversion_is_refused_and_a_stale_one_redone(
    killed, tmp_path, monkeypatch
):
    """The universal twin of a verified checkpoint is reused only while it verifies against
    its own manifest, and only if converted from the same contents; else it is converted again."""
    ckpt = copy_checkpoints(killed, tmp_path)
    p = plan_of(ckpt, monkeypatch)
    converted = []

    def convert(source: Path, out: Path) -> None:  # DeepSpeed's conversion, its output faked
        converted.append(source)
        (out / "zero").mkdir(parents=True)
        shutil.copyfile(source / SHARD, out / "zero/optimizer_state.pt")

    monkeypatch.setattr(checkpoints, "convert", convert)
    p.universal = True
    checkpoints.to_universal(ckpt, p, 1, 2)
    done = ckpt / "step_000004_universal"
    assert converted == [ckpt / "step_000004"]
    assert manifest.verify(done)["checkpoint"] == {"tag": "step_000004", "converted_from": p.digest}
    checkpoints.to_universal(ckpt, p, 1, 2)  # kept: converted once
    assert len(converted) == 1
    flip_bit(done / "zero/optimizer_state.pt")
    with pytest.raises(
        manifest.ManifestError,
        match=r"resume refused \S*/step_000004_universal: \S*/zero/optimizer_state\.pt: sha256",
    ):
        checkpoints.to_universal(ckpt, p, 1, 2)
    assert len(converted) == 1
    manifest.write(done, extra={"checkpoint": {"tag": "step_000004", "converted_from": "other"}})
    checkpoints.to_universal(ckpt, p, 1, 2)  # converted from other contents: redone
    assert len(converted) == 2 and manifest.verify(done)["checkpoint"]["converted_from"] == p.digest


RANK = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import torch.distributed as dist
    from arenaflow import manifest
    from arenaflow.train import checkpoints

    class Engine:  # each rank writes its own shard, rank 1 late; no barrier after (async)
        def save_checkpoint(self, save_dir, tag, client_state):
            rank = os.environ["RANK"]
            Path(save_dir, tag).mkdir(parents=True, exist_ok=True)
            if rank == "1":
                time.sleep(1.5)
            Path(save_dir, tag, f"shard_{rank}.pt").write_text(rank)
            if rank == "0":
                Path(save_dir, "latest").write_text(tag)

    write = manifest.write
    def logged_write(*a, **k):
        print("manifest written", flush=True)
        return write(*a, **k)
    manifest.write = logged_write

    dist.init_process_group("gloo")
    ckpt = Path(sys.argv[1])
    checkpoints.save(Engine(), ckpt, 4, [], {"lr": 1e-4}, 2, 3)
    dist.destroy_process_group()
    """
)


def test_rank_0_alone_writes_the_manifest_once_every_rank_has_saved(tmp_path, repo_root):
    ckpt = tmp_path / "checkpoints"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env.update(WORLD_SIZE="2", PYTHONPATH=str(repo_root / "src"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(ckpt)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert [out.count("manifest written") for out, _ in outs] == [1, 0]
    rec = manifest.verify(ckpt / "step_000004")
    assert sorted(rec["files"]) == ["shard_0.pt", "shard_1.pt"]
    assert rec["checkpoint"]["step"] == 4 and rec["params"] == {"lr": 1e-4}
