"""A fault at a random moment (the `dag` tier): a real sampling process SIGKILLed after some of its
batches, then run again. benchmarks/soak.py's runs: test_soak_runs.py."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
from dagrun import REPO

from arenaflow import io
from arenaflow.decode import parts
from arenaflow.pools import math as mathpool

pytestmark = pytest.mark.dag

BASE = REPO / "models/tiny-arith"
# 12 prompts, k 2, batch_size 2: one prompt a batch, 12 batches
PARAMS = {"k": 2, "temperature": 0.8, "top_p": 1.0, "max_new_tokens": 16, "batch_size": 2}
BATCHES = 12


def sample_cmd(pool, out) -> list[str]:
    return [
        sys.executable,
        "-m",
        "arenaflow.candidates",
        "sample",
        "--pool",
        str(pool),
        "--base-model",
        str(BASE),
        "--params-json",
        json.dumps(PARAMS),
        "--out",
        str(out),
    ]


def run(cmd) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def decoded_batches(stderr: str) -> int:
    """Batches a job decoded itself: sampling prints a progress line for each, none for a batch
    a part gave back."""
    return len(re.findall(r"prompts x2 \|", stderr))


def test_a_sigkilled_sampling_job_decodes_only_its_missing_batches_into_the_same_bytes(tmp_path):
    pool = tmp_path / "pool.jsonl"
    io.write_jsonl(pool, mathpool.generate(BATCHES, 7, "train", {"add": 1, "sub": 1}, "p"))
    whole = run(sample_cmd(pool, tmp_path / "whole/samples.jsonl"))
    assert decoded_batches(whole.stderr) == BATCHES

    out = tmp_path / "killed/samples.jsonl"
    out.parent.mkdir()
    proc = subprocess.Popen(sample_cmd(pool, out), cwd=REPO, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while len(list(parts.parts_dir(out).glob("part-*.jsonl"))) < 3:
        assert proc.poll() is None, "the job ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    kept = sorted(
        int(parts.PART.fullmatch(p.name)[1]) for p in parts.parts_dir(out).glob("part-*.jsonl")
    )
    assert not out.exists() and 3 <= len(kept) < BATCHES

    rerun = run(sample_cmd(pool, out))
    assert f"resuming with {len(kept)} finished batch(es) {kept}" in rerun.stderr
    assert decoded_batches(rerun.stderr) == BATCHES - len(kept)
    assert out.read_bytes() == (tmp_path / "whole/samples.jsonl").read_bytes()
    assert not parts.parts_dir(out).exists()
