"""train/one_rank: a one-rank ZeRO-2 optimizer without its identity all-reduce takes bitwise the
steps DeepSpeed's own takes, and never runs the reduction's copies. In a subprocess: DeepSpeed's
process group is global state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
import deepspeed, torch
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from arenaflow.train.speed import one_rank
from arenaflow.train.dist import deepspeed_config, ensure_dist_env

ensure_dist_env()
deepspeed.init_distributed(dist_backend="gloo")
copies = []
original = DeepSpeedZeroOptimizer.allreduce_and_copy
DeepSpeedZeroOptimizer.allreduce_and_copy = lambda self, b, *a, **k: (
    copies.append(len(b)), original(self, b, *a, **k))[1]
hyper = {"micro_batch_size": 4, "grad_accum": 1, "max_grad_norm": 0.5,
         "zero3_persistence_threshold": 0, "precision": "auto"}

def train(skip):
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(6)])
    engine, opt, *_ = deepspeed.initialize(
        model=net, optimizer=torch.optim.AdamW(net.parameters(), lr=1e-2),
        config=deepspeed_config(hyper, False, False, 2, 1))
    installed = one_rank.install(opt) if skip else None
    del copies[:]
    g = torch.Generator().manual_seed(1)
    losses = []
    for step in range(3):
        loss = engine(torch.randn(4, 16, generator=g)).pow(2).sum()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    weights = [p.detach().flatten().tolist() for p in net.parameters()]
    return {"installed": installed, "copies": sum(copies), "losses": losses, "weights": weights}

json.dump({"deepspeed": train(False), "skipped": train(True)}, sys.stdout)
"""


def test_one_rank_steps_bitwise_as_deepspeed_without_the_copies():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    own, skipped = out["deepspeed"], out["skipped"]
    assert own["copies"] == 3 * 12  # DeepSpeed's: 12 tensors copied back a step
    assert skipped["installed"] and skipped["copies"] == 0
    assert own["losses"][-1] < own["losses"][0]  # the steps moved the weights
    assert skipped["losses"] == own["losses"]
    assert skipped["weights"] == own["weights"]  # bitwise: floats compared for equality


def test_other_optimizers_are_left_alone():
    import torch

    from arenaflow.train.speed import one_rank

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    assert not one_rank.install(opt)
    assert "buffered_reduce_fallback" not in vars(opt)
