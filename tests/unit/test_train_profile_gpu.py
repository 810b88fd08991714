"""benchmarks/train_profile_gpu.py's launch count, read from the profile tables the training
writes (ARENAFLOW_PROFILE_STEP): a synthetic file, and the H200 profile stored in
benchmarks/results."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))  # its sibling imports (gpu_bench, zero_stage_cpu)
import train_profile_gpu  # noqa: E402

ROW = "{:>40}  1.00%  1.000ms  1.00%  1.000ms  1.000us  0.000us  0.00%  0.000us  0.000us  {}"


def test_launches_are_counted_once_though_both_tables_list_them():
    device = [ROW.format("aten::mm", 7), ROW.format("cudaLaunchKernel", 10)]
    host = [ROW.format("cudaLaunchKernel", 10), ROW.format("cuLaunchKernelEx", 5)]
    table = "\n".join([*device, "Self CPU time total: 1ms", *host, "Self CPU time total: 1ms"])
    assert train_profile_gpu.launches(table) == 15


def test_the_stored_h200_stage2_step_reads_its_launch_rows():
    """8,021 cudaLaunchKernel + 1,856 cuLaunchKernelEx calls, as its host table lists them."""
    path = REPO / "benchmarks/results/train_profile_gpu_2026-12-01/stage2.profile_rank0.txt"
    assert train_profile_gpu.launches(path.read_text()) == 8021 + 1856
