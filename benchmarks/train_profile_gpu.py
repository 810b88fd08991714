"""Where a one-rank SmolLM2-135M LoRA step's time goes on one GPU, by set-up.

    python benchmarks/train_profile_gpu.py --out-dir $OUT/train_profile [--rows 512 --seq 80
        --steps 6 --profile-step 4 --setups stage2,stage2-unfused,stage3]

SmolLM2-135M's shape with random weights (zero_stage_cpu.SHAPES; the step's cost depends on
shapes, not values), one `python -m arenaflow.train` run per set-up with LoRA r 64 on all seven
projections, `--rows` rows of `--seq` tokens a step (the lineage's S1 steps carry ~39k tokens).
Writes per set-up the metrics (each step's elapsed time, so the first step's compile shows apart)
and the torch.profiler tables of step `--profile-step` (device time, then host time) to --out-dir,
and prints the first step's seconds, the steady seconds a step and tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

from gpu_bench import LORA
from zero3_hooks_cpu import build, run
from zero_stage_cpu import SHAPES

from arenaflow import knobs

SETUPS = {  # (hyper, engine settings); fused kernels named: `auto` would leave a short run unfused
    "stage2": ({"zero_stage": 2, "fused_kernels": True}, {}),
    "stage2-unfused": ({"zero_stage": 2, "fused_kernels": False}, {}),
    "stage3": ({"zero_stage": 3, "fused_kernels": True}, {}),
    # DeepSpeed's bf16 overflow check, off by default (docs/benchmark-log.md, runs 12-14)
    "stage2-overflow-check": (
        {"zero_stage": 2, "fused_kernels": True},
        {"bf16_overflow_check": True},
    ),
}
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def launches(table: str) -> int:
    """Kernel launches in a profile file of train/loop.py's finish_profile: the calls of the CUDA
    launch functions, read from whichever of its two tables (device time, host time; the same
    events) lists them."""
    calls = {}
    for line in table.splitlines():
        words = line.split()
        if words and words[0] in LAUNCHES:
            calls[words[0]] = int(words[-1])
    return sum(calls.values())


def step_times(metrics: list[dict], profiled: int) -> tuple[float, float]:
    """(first step's seconds, median seconds of the later steps but the profiled one): the
    profiler makes its step many times slower."""
    ends = [m["elapsed_s"] for m in metrics]
    later = [b - a for a, b, m in zip(ends, ends[1:], metrics[1:]) if m["step"] != profiled]
    return ends[0], statistics.median(later)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--seq", type=int, default=80)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--profile-step", type=int, default=4)
    ap.add_argument("--setups", default=",".join(SETUPS))
    args = ap.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    os.environ[knobs.PROFILE_STEP] = str(args.profile_step)  # the trainings inherit it
    run_args = argparse.Namespace(steps=args.steps, micro=args.rows, seq=args.seq, threads=4)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, corpus = build(root, 0, 0, args.steps * args.rows + 4, args.seq, SHAPES["smollm2"])
        for i, name in enumerate(args.setups.split(",")):
            hyper, settings = SETUPS[name]
            run(root, model, corpus, {**hyper, "lora": LORA}, run_args, i, engine=settings)
            runs = root / f"runs/{i}"
            m = [json.loads(x) for x in (runs / "final/metrics.jsonl").read_text().splitlines()]
            first, steady = step_times(m, args.profile_step)
            table = runs / "profile_rank0.txt"
            n = launches(table.read_text()) if table.exists() else 0
            print(
                f"{name:22s} first step {first:6.2f} s  steady {steady * 1e3:7.1f} ms/step "
                f"(median) = {args.rows * args.seq / steady:9,.0f} tokens/s; "
                f"{n:,} kernel launches in step {args.profile_step}",
                flush=True,
            )
            for f in ("profile_rank0.txt", "final/metrics.jsonl"):
                if (runs / f).exists():
                    shutil.copy(runs / f, out / f"{name}.{Path(f).name}")


if __name__ == "__main__":
    main()
