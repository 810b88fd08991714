"""train/grad_norm: DeepSpeed's ZeRO-2 optimizer, its gradient norm computed by multi-tensor
kernels, clips by the norm torch computes from the same gradients (an independent oracle), and
takes the step a plain AdamW with torch's clipping takes. In a subprocess: DeepSpeed's process
group is global state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import copy, json, sys
import deepspeed, torch
from arenaflow.train.speed import grad_norm
from arenaflow.train.dist import deepspeed_config, ensure_dist_env

ensure_dist_env()
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(6)])
plain = copy.deepcopy(net)
hyper = {"micro_batch_size": 4, "grad_accum": 1, "max_grad_norm": 0.5,
         "zero3_persistence_threshold": 0, "precision": "auto"}
engine, opt, *_ = deepspeed.initialize(
    model=net, optimizer=torch.optim.AdamW(net.parameters(), lr=1e-2),
    config=deepspeed_config(hyper, False, False, 2, 1))
calls = []
installed = grad_norm.install(opt)
ours = opt.get_grad_norm_direct
opt.get_grad_norm_direct = lambda *a, **k: calls.append(1) or ours(*a, **k)
ref_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
out = {"installed": installed, "norms": [], "ref_norms": []}
for step in range(3):
    x = torch.randn(4, 16)
    engine.backward(engine(x).pow(2).sum())
    engine.step()
    out["norms"].append(float(engine.get_global_grad_norm()))
    plain(x).pow(2).sum().backward()
    out["ref_norms"].append(float(torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)))
    ref_opt.step()
    ref_opt.zero_grad()
out["calls"] = len(calls)
out["max_weight_diff"] = max(
    float((a - b).abs().max()) for a, b in zip(net.parameters(), plain.parameters()))
json.dump(out, sys.stdout)
"""


def test_zero2_clips_by_torchs_norm_and_steps_as_plain_adamw():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["installed"] and out["calls"] == 3  # the step used ours, once a step
    assert min(out["ref_norms"]) > 0.5  # every step clipped: the norm decided each update
    for ours, ref in zip(out["norms"], out["ref_norms"]):
        assert abs(ours - ref) <= 1e-5 * ref, (out["norms"], out["ref_norms"])
    assert out["max_weight_diff"] < 1e-5, out


def test_other_optimizers_are_left_alone():
    import torch

    from arenaflow.train.speed import grad_norm

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    assert not grad_norm.install(opt)
    assert "get_grad_norm_direct" not in vars(opt)


def test_sum_of_squares_is_the_squared_norm_of_all_tensors():
    import torch

    from arenaflow.train.speed import grad_norm

    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(n, generator=gen).to(torch.bfloat16) for n in (3, 70, 1000)]
    want = torch.cat([g.float() for g in grads]).pow(2).sum()
    got = grad_norm.sum_of_squares(grads)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert float(grad_norm.sum_of_squares([])) == 0.0
