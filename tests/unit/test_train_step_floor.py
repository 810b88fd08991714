"""benchmarks/train_step_floor_gpu.py compares arenaflow's one-rank DeepSpeed step
with the same step in plain PyTorch; the comparison means something only if both take the same
steps. On CPU in float32 they must: the same losses, step after step, to float32's rounding;
arenaflow's step as it was before its norms went through torch.rms_norm and its gradient norm
through multi-tensor kernels, too; and the job's step with transformers' rotary embedding in
place of train/rope's, and with DeepSpeed's one-rank all-reduce, bitwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_plain_torch_step_takes_deepspeeds_steps(tmp_path):
    out = tmp_path / "floor.json"
    cmd = [sys.executable, "train_step_floor_gpu.py", "--cpu", "--layers", "2", "--rows", "4"]
    setups = "deepspeed,deepspeed-before,torch,deepspeed-job,deepspeed-job-hf-rope"
    setups += ",deepspeed-job-reduce,deepspeed-job-grouped"
    cmd += ["--seq", "32", "--steps", "4", "--setups", setups]
    cmd += ["--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run(
        cmd, cwd=REPO / "benchmarks", env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    setups = json.loads(out.read_text())["setups"]
    ds, plain = setups["deepspeed"]["losses"], setups["torch"]["losses"]
    assert ds[-1] < ds[0] - 0.1  # AdamW moved the weights: later losses test the update
    for step, (a, b) in enumerate(zip(ds, plain), 1):
        assert abs(a - b) <= 1e-6 * abs(a), f"step {step}: DeepSpeed {a} vs plain {b}"
    # arenaflow's step until 2026-12-03 (transformers' norm, DeepSpeed's per-tensor grad norm)
    for step, (a, b) in enumerate(zip(ds, setups["deepspeed-before"]["losses"]), 1):
        assert abs(a - b) <= 1e-6 * abs(a), f"step {step}: DeepSpeed {a} vs before {b}"
    # train/rope's rotary embedding against transformers' own: bitwise the same steps
    job, hf_rope = setups["deepspeed-job"]["losses"], setups["deepspeed-job-hf-rope"]["losses"]
    assert job[-1] < job[0] - 0.1 and job == hf_rope
    # and train/one_rank's skip against DeepSpeed's identity all-reduce: bitwise too
    assert job == setups["deepspeed-job-reduce"]["losses"]
    # train/lora_grouped's q/k/v and gate/up: the same steps, to float32's rounding (not bitwise)
    for step, (a, b) in enumerate(zip(job, setups["deepspeed-job-grouped"]["losses"]), 1):
        assert abs(a - b) <= 1e-6 * abs(a), f"step {step}: job {a} vs grouped {b}"


def test_adamw_state_made_before_the_first_step_takes_the_same_steps(monkeypatch):
    """torch-graph-first makes AdamW's state before the step a graph records (made inside the
    recording, every replay would zero it again: the GPU run's losses drifted from step 3 on
    until it did). Made so, the state must be AdamW's own: the same steps, exactly."""
    import argparse

    import torch

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import train_step_floor_gpu as floor

    args = argparse.Namespace(layers=2, rows=4, seq=32)
    lazy, early = floor.PlainStep(args, "cpu"), floor.PlainStep(args, "cpu")
    early.init_state()
    assert len(early.opt.state) == len(early.high) and not lazy.opt.state
    losses = [(float(lazy()), float(early())) for _ in range(4)]
    assert losses[-1][0] < losses[0][0] - 0.1, losses  # the updates moved the weights
    assert all(a == b for a, b in losses), losses
    for a, b in zip(lazy.high, early.high):
        assert torch.equal(a, b)


def test_the_jobs_objective_over_bucketed_shapes_takes_transformers_steps(tmp_path):
    """--shapes and the deepspeed-job set-up reproduce a job's steps: micro-batches of
    a new shape each step, the loss through objective.sft_sum. That loss, over the supervised
    tokens, is transformers' own mean: both take the same steps, shape after shape."""
    out = tmp_path / "floor.json"
    cmd = [sys.executable, "train_step_floor_gpu.py", "--cpu", "--layers", "2", "--steps", "4"]
    cmd += ["--shapes", "4x32,3x40,5x24", "--setups", "deepspeed-job,deepspeed", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run(
        cmd, cwd=REPO / "benchmarks", env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["args"]["rows"] == 5 and got["args"]["seq"] == 40  # the warm-up's shape
    job, hf = (got["setups"][s]["losses"] for s in ("deepspeed-job", "deepspeed"))
    assert len(set(job)) == 4  # four steps on three shapes: not one batch repeated
    for step, (a, b) in enumerate(zip(job, hf), 1):
        assert abs(a - b) <= 1e-6 * abs(a), f"step {step}: sft_sum {a} vs transformers {b}"


def test_a_step_whose_rows_hold_only_prompt_tokens_is_refused(monkeypatch, capsys):
    """Rows no longer than the prompt that the loss leaves out have no supervised token: the
    loss would be NaN, every step, and the timing of nothing. The options are refused, naming
    the shape."""
    import pytest

    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import train_step_floor_gpu as floor

    shapes = f"4x{floor.PROMPT + 1},2x{floor.PROMPT}"
    monkeypatch.setattr(sys, "argv", ["train_step_floor_gpu.py", "--cpu", "--shapes", shapes])
    with pytest.raises(SystemExit):
        floor.parse_args()
    err = capsys.readouterr().err
    assert f"got 2x{floor.PROMPT}" in err and f"4x{floor.PROMPT + 1}" not in err
    argv = ["train_step_floor_gpu.py", "--cpu", "--rows", "3", "--seq", str(floor.PROMPT + 1)]
    monkeypatch.setattr(sys, "argv", argv)
    assert floor.parse_args().shape_list == [(3, floor.PROMPT + 1)]
