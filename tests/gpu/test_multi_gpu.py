"""Multi-GPU ZeRO-3 over NCCL: benchmarks/multi_gpu.py's checks on a small model.

Needs 2 or more CUDA GPUs and DeepSpeed; skipped elsewhere (CI has none). The full-size run
and its numbers are in BENCHMARKS.md, with the command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more CUDA GPUs"),
]


def test_two_gpus_match_one_reload_and_resume_across_world_sizes(tmp_path):
    out = tmp_path / "multi_gpu.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks/multi_gpu.py"),
            "--out",
            str(out),
            "--root",
            str(tmp_path / "scratch"),
            "--layers",
            "2",
            "--hidden",
            "512",
            "--seq",
            "512",
            "--steps",
            "12",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    res = json.loads(out.read_text())
    failed = [c for c, ok in res["checks"].items() if not ok]
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-3000:], proc.stderr[-3000:])
    assert (
        len(res["checks"]) == 9
    )  # losses, world size (LoRA and full), reload, four resume checks (with the weights)
