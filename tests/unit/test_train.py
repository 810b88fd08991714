"""ZeRO-3 LoRA training on CPU through the real entry point (python -m arenaflow.train)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from hypers import TINY_ARM
from safetensors.torch import load_file

from arenaflow import manifest
from arenaflow.bases import tinymodel
from arenaflow.corpora import build as corpora
from arenaflow.pools import math as mathpool
from arenaflow.train import argv as train_argv

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "models/tiny-arith"
HYPER = {
    **TINY_ARM,
    "lora": {**TINY_ARM["lora"], "target_modules": ["q_proj", "v_proj", "down_proj"]},
    "grad_accum": 2,
    "zero3_persistence_threshold": 0,  # partition every parameter: exposes an ungathered save
    "zero_stage": 3,  # ZeRO-3 on one rank too (auto would run stage 2; test_train_fidelity.py)
}


def run_train(out: Path, corpus: Path, init: str = "base", hyper: dict | None = None, check=True):
    proc = subprocess.run(
        train_argv(out.parent.name, hyper or HYPER, corpus, BASE, out, init),
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr[-5000:])
    return proc


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "c"
    rows = mathpool.generate(48, 3, "train", {"add": 1, "mul": 1}, "t")
    tok = tinymodel.build_tokenizer()
    corpora.build(out, rows, tok, tinymodel.SYSTEM_PROMPT, {})
    return out


@pytest.fixture(scope="module")
def first(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("runs") / "A1" / "final"
    run_train(out, corpus)
    return out


def test_saved_adapter_is_gathered_not_empty_zero3_shards(first):
    weights = load_file(first / "adapter_model.safetensors")
    assert weights, "no tensors saved"
    for name, t in weights.items():
        assert t.numel() > 0 and t.dim() == 2, f"{name} saved with shape {tuple(t.shape)}"
    # lora_B starts at zero; after training it must have moved
    assert any(t.abs().sum() > 0 for n, t in weights.items() if "lora_B" in n)
    # written by train/model.save_adapter inside the gather, not by PEFT (whose model card it is)
    assert not (first / "README.md").exists()


def test_evidence_records_corpus_digest_steps_and_base(first, corpus):
    ev = json.loads((first / "training_evidence.json").read_text())
    assert ev["dataset_sha256"] == manifest.verify(corpus)["digest"]
    assert ev["manifest_sha256"] == manifest.sha256_file(corpus / "manifest.json")
    # 48 rows / (4 micro x 2 accum x 1 rank) = 6 steps
    assert ev["optimizer_steps"] == 6
    assert ev["init"] == "base" and ev["hyperparameters"].items() >= HYPER.items()
    metrics = [json.loads(line) for line in (first / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 7))
    assert all(m["grad_norm"] is not None and m["grad_norm"] > 0 for m in metrics)
    manifest.verify(first)


def test_adapter_logits_reload_and_base_weights_untouched(first):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(BASE)
    ref = {k: v.clone() for k, v in base.state_dict().items()}
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    plain = base(ids).logits
    tuned = PeftModel.from_pretrained(base, first)
    assert not torch.allclose(tuned(ids).logits, plain), "adapter changes nothing"
    merged = tuned.merge_and_unload()
    assert not torch.equal(
        merged.state_dict()["model.layers.0.self_attn.q_proj.weight"],
        ref["model.layers.0.self_attn.q_proj.weight"],
    )
    # training left the base's weights file as it was built (BUILD.json recorded its sha256)
    built = json.loads((BASE / "BUILD.json").read_text())["weights_sha256"]
    assert manifest.sha256_file(BASE / "model.safetensors") == built


def test_child_arm_continues_its_init_adapter(first, corpus, tmp_path):
    child = tmp_path / "A2" / "final"
    hyper = {**HYPER, "lr": 1e-12, "max_steps": 1}  # so small the adapter cannot move
    run_train(child, corpus, init=str(first), hyper=hyper)
    a, b = (
        load_file(first / "adapter_model.safetensors"),
        load_file(child / "adapter_model.safetensors"),
    )
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0)
    assert json.loads((child / "training_evidence.json").read_text())["init"] == "A1"


def test_tampered_corpus_is_refused_before_training(corpus, tmp_path):
    bad = tmp_path / "bad"
    import shutil

    shutil.copytree(corpus, bad)
    with open(bad / "rows.jsonl", "a") as f:
        f.write("\n")
    proc = run_train(tmp_path / "X" / "final", bad, check=False)
    assert proc.returncode != 0
    assert "rows.jsonl" in proc.stderr and "does not match" in proc.stderr
    assert not (tmp_path / "X" / "final").exists()


def test_unknown_target_module_fails_with_its_name(corpus, tmp_path):
    hyper = {**HYPER, "lora": {**HYPER["lora"], "target_modules": ["q_proj", "in_proj"]}}
    proc = run_train(tmp_path / "Y" / "final", corpus, hyper=hyper, check=False)
    assert proc.returncode != 0 and "in_proj" in proc.stderr


def test_a_diverged_step_stops_the_run_naming_it_and_writes_no_adapter(corpus, tmp_path):
    """An LR of 1e30 sends the first step's LoRA weights to ~1e30, so the second step's forward
    overflows. DeepSpeed would skip that step and go on (and with bf16, as configured, apply
    it); the run must stop there instead."""
    out = tmp_path / "D" / "final"
    proc = run_train(out, corpus, hyper={**HYPER, "lr": 1e30}, check=False)
    assert proc.returncode != 0
    assert "arm D: step 2 has loss" in proc.stderr and "training diverged" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("warmup_ratio", [0.5, 0.0])
def test_a_one_step_run_inside_the_warm_up_is_told_its_weights_will_not_change(
    corpus, tmp_path, warmup_ratio
):
    """48 rows, 48 rows a step: one optimizer step. In the warm-up it is taken at LR 0 (the
    fresh adapter's B stays all zero) and the log says so; without warm-up it trains."""
    hyper = {**HYPER, "micro_batch_size": 48, "grad_accum": 1, "warmup_ratio": warmup_ratio}
    out = tmp_path / "W" / "final"
    proc = run_train(out, corpus, hyper=hyper)
    lora_b = [v for k, v in load_file(out / "adapter_model.safetensors").items() if "lora_B" in k]
    moved = any(bool(v.abs().sum() > 0) for v in lora_b)
    told = "the weights will not change" in proc.stderr
    assert (told, moved) == ((True, False) if warmup_ratio else (False, True))


def test_a_build_lock_left_by_a_killed_build_is_removed_and_a_live_ones_kept(tmp_path, monkeypatch):
    """A killed build of DeepSpeed's CPU shared-memory op leaves torch's lock behind, and every
    later CPU training waited on it forever in init_distributed (this repo's CI machine, sessions
    11 and 21). A lock is kept while it is young or a process works in its build directory (as
    ninja does), and removed once neither holds."""
    import os
    import subprocess
    import time

    from arenaflow.train import build_lock

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = build_lock.lock_path()
    assert lock == tmp_path / "deepspeed_shm_comm" / "lock"
    assert build_lock.clear_stale(lock) is None  # no lock
    lock.touch()
    assert build_lock.clear_stale(lock) is None and lock.exists()  # a builder starting ninja
    old = time.time() - 2 * build_lock.GRACE_S
    os.utime(lock, (old, old))
    ninja = subprocess.Popen(["sleep", "60"], cwd=lock.parent)  # a build under way
    try:
        assert build_lock.building(lock.parent)
        assert build_lock.clear_stale(lock) is None and lock.exists()
    finally:
        ninja.kill()
        ninja.wait()
    assert build_lock.clear_stale(lock) == lock and not lock.exists()


def test_the_lock_watch_thread_imports_nothing(tmp_path):
    """An import on the watch thread deadlocked with init_distributed's imports on the main
    thread, each holding a module lock (seen in this repo's CI): in a fresh interpreter, the
    thread clears a stale lock without importing anything."""
    import os
    import subprocess
    import sys
    import time

    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.touch()
    old = time.time() - 3600
    os.utime(lock, (old, old))
    code = """
import sys, threading, time
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if threading.current_thread().name == "build-lock-watch":
            seen.append(name)
sys.meta_path.insert(0, Spy())
from arenaflow.train import build_lock
with build_lock.watched(poll_s=0.05):
    time.sleep(2)
print(seen)
"""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]" and not lock.exists()


def test_a_waiter_is_released_when_the_lock_goes_stale_while_it_waits(tmp_path, monkeypatch):
    """torch's waiter polls for the lock to go; the watch around init_distributed removes it
    once stale, so a waiter started while the lock was young does not wait forever."""
    import os
    import time

    from torch.utils.file_baton import FileBaton

    from arenaflow.train import build_lock

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(build_lock, "GRACE_S", 0.5)
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.touch()  # its builder is gone: no process works in the directory
    t0 = time.monotonic()
    with build_lock.watched(poll_s=0.2):
        FileBaton(os.fspath(lock)).wait()
    assert not lock.exists() and time.monotonic() - t0 < 30
