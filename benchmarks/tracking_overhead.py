"""What the experiment trackers cost a training step (arenaflow.tracking): a training's record
(train/progress.py's: loss, grad norm, two learning rates, tokens/s, tokens seen) sent `--records`
times through TensorBoard and MLflow's file store, as a job sends them, timing (a) the call on
the step's thread (an enqueue) and (b) the backends' threads draining them (their writes, which
hold the GIL, so on a busy core they may take that time from the step). (a) + (b) per record,
over the time of one optimizer step of a training (its metrics.jsonl: the median step), bounds
what logging every step costs it.

    python benchmarks/tracking_overhead.py [--records 2000] [--metrics runs/S1/final/metrics.jsonl]
    python benchmarks/tracking_overhead.py --train-pairs 3      # and whole trainings, on vs off

With --train-pairs N, also N pairs of the same tiny CPU LoRA training (tests/unit/hypers.py's
TINY_ARM on 64 math rows, 16 steps, through python -m arenaflow.train), one with TensorBoard and
MLflow's file store and one without, in alternating order: the time of their steps (the last
step's elapsed_s less the first's, from metrics.jsonl) and of the whole process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from arenaflow import tracking


def step_seconds(metrics: Path) -> float:
    """The median time of one optimizer step of a finished training (its elapsed_s column)."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    times = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    return statistics.median(times)


def measure(backends: list[str], n: int, root: Path) -> dict:
    s = tracking.settings({"backends": backends}, root)
    run = tracking.open_run(s, "A", kind="train", params={"lr": 1e-3})
    while not all(w.idle() for w in run.workers):  # the backends' start-up: once, at set-up
        time.sleep(0.01)
    t0 = time.perf_counter()
    for step in range(1, n + 1):
        run.log_metrics(
            {
                "train/loss": 1.0 / step,
                "train/grad_norm": 0.5,
                "train/lr/lora": 1e-3,
                "train/lr/lm_head": 1e-4,
                "train/tokens_per_s": 5000.0,
                "train/tokens_seen": 100 * step,
            },
            step,
        )
    enqueue = time.perf_counter() - t0
    while not all(w.idle() for w in run.workers):
        time.sleep(0.001)
    drained = time.perf_counter() - t0
    run.close(30.0)
    return {
        "backends": backends,
        "records": n,
        "enqueue_us_per_record": round(1e6 * enqueue / n, 2),
        "written_us_per_record": round(1e6 * drained / n, 2),
    }


def train_pairs(n: int, root: Path) -> list[dict]:
    import os
    import subprocess
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
    from hypers import TINY_ARM

    from arenaflow.bases import tinymodel
    from arenaflow.corpora import build as corpora
    from arenaflow.pools import math as mathpool
    from arenaflow.train import argv as train_argv

    base = Path(__file__).resolve().parents[1] / "models/tiny-arith"
    corpus = root / "corpora" / "c"
    rows = mathpool.generate(64, 3, "train", {"add": 1, "mul": 1}, "t")
    corpora.build(corpus, rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {})
    out = []
    for i in range(n):
        for on in (True, False) if i % 2 == 0 else (False, True):
            res = root / f"r{i}-{on}"
            s = tracking.settings({"backends": ["tensorboard", "mlflow"]}, res) if on else None
            flag = ["--tracking-json", json.dumps(s)] if s else []
            t0 = time.perf_counter()
            subprocess.run(
                train_argv("A", TINY_ARM, corpus, base, res / "runs/A/final", extra=flag),
                check=True,
                capture_output=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            wall = time.perf_counter() - t0
            m = [
                json.loads(x)
                for x in (res / "runs/A/final/metrics.jsonl").read_text().split("\n")
                if x
            ]
            steps_s = m[-1]["elapsed_s"] - m[0]["elapsed_s"]
            out.append(
                {
                    "pair": i,
                    "tracking": on,
                    "steps": len(m),
                    "steps_s": round(steps_s, 3),
                    "process_s": round(wall, 2),
                }
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2000, help="records to send")
    ap.add_argument(
        "--metrics", type=Path, default=None, help="a training's metrics.jsonl: its step time"
    )
    ap.add_argument("--train-pairs", type=int, default=0, help="pairs of trainings, on and off")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = [measure(b, args.records, Path(tmp) / b[0]) for b in (["tensorboard"], ["mlflow"])]
        trainings = train_pairs(args.train_pairs, Path(tmp)) if args.train_pairs else []
    if args.metrics:
        step = step_seconds(args.metrics)
        for r in out:
            r["median_step_s"] = round(step, 4)
            r["bound_percent_of_step"] = round(100 * r["written_us_per_record"] / 1e6 / step, 3)
    if trainings:
        on = [t["steps_s"] for t in trainings if t["tracking"]]
        off = [t["steps_s"] for t in trainings if not t["tracking"]]
        out.append(
            {
                "trainings": trainings,
                "median_steps_s_on": statistics.median(on),
                "median_steps_s_off": statistics.median(off),
            }
        )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
