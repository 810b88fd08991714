"""benchmarks/multi_gpu.py's checks on gloo ranks (its resume 8 -> 4 -> 8, at 4 -> 2 -> 4).

The GPU runs need hardware CI lacks; the same script with `--device cpu` runs every check but the
rates: 4 ranks against 1 at the same global batch, the reloaded adapter, and a LoRA run killed
at step 4 on 4 ranks, resumed on 2 and killed at step 8, resumed on 4 to the end, whose final
adapter must equal the uninterrupted 4-rank run's weights."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("multi_gpu", REPO / "benchmarks/multi_gpu.py")
multi_gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(multi_gpu)


@pytest.mark.ranks
def test_four_ranks_resume_through_two_to_the_uninterrupted_runs_weights(tmp_path):
    out = tmp_path / "multi.json"
    args = ["--device", "cpu", "--gpus", "4", "--layers", "2", "--hidden", "256", "--seq", "128"]
    args += ["--micro", "2", "--steps", "12", "--methods", "lora"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks/multi_gpu.py"), *args, "--out", str(out)]
        + ["--root", str(tmp_path / "scratch")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    res = json.loads(out.read_text())
    failed = [c for c, ok in res["checks"].items() if not ok]
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:])
    legs = res["resume"]["legs"]
    assert [(leg["gpus"], leg["rc"] == 0) for leg in legs] == [(4, False), (2, False), (4, True)]
    assert "step_000004 at step 4" in legs[1]["resumed"]
    assert "step_000008 at step 8" in legs[2]["resumed"]
    assert "resume: 4->2->4 legs resumed through the universal checkpoint" in res["checks"]
    assert res["resume"]["weights_rel_diff"] < 1e-4  # fp32 on CPU: reduction order only


def test_weights_rel_diff_sees_one_changed_tensor_and_a_missing_one(tmp_path):
    a, b, c = (tmp_path / x for x in "abc")
    for d in (a, b, c):
        d.mkdir()
    g = torch.Generator().manual_seed(0)
    w = {"x": torch.randn(8, 4, generator=g), "y": torch.randn(4, generator=g)}
    save_file(w, a / "adapter_model.safetensors")
    save_file({**w, "y": w["y"] * 1.1}, b / "adapter_model.safetensors")
    save_file({"x": w["x"]}, c / "adapter_model.safetensors")
    assert multi_gpu.weights_rel_diff(a, a) == 0.0
    assert abs(multi_gpu.weights_rel_diff(b, a) - 0.1) < 1e-6
    assert multi_gpu.weights_rel_diff(c, a) == float("inf")
