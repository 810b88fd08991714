"""benchmarks/adapter_save.py times PEFT's save of a LoRA adapter against the same save handed
its tensors from one host copy; the comparison means something only if both write the same
files, which the script checks and refuses otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_benchmark_compares_two_saves_of_the_same_bytes(tmp_path):
    out = tmp_path / "save.json"
    cmd = [sys.executable, "adapter_save.py", "--cpu", "--layers", "2", "--reps", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run(
        [*cmd, "--out", str(out)],
        cwd=REPO / "benchmarks",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["same_bytes"] and result["adapter_tensors"] == 2 * 7 * 2
