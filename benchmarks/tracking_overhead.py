"""What the experiment trackers cost a training step (arenaflow.tracking): a training's record
(train/progress.py's: loss, grad norm, two learning rates, tokens/s, tokens seen) sent `--records`
times through TensorBoard and MLflow's file store, as a job sends them, timing (a) the call on
the step's thread (an enqueue) and (b) the backends' threads draining them (their writes, which
hold the GIL, so on a busy core they may take that time from the step). (a) + (b) per record,
over the time of one optimizer step of a training (its metrics.jsonl: the median step), bounds
what logging every step costs it.

    python benchmarks/tracking_overhead.py [--records 2000] [--metrics runs/S1/final/metrics.jsonl]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2000, help="records to send")
    ap.add_argument(
        "--metrics", type=Path, default=None, help="a training's metrics.jsonl: its step time"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = [measure(b, args.records, Path(tmp) / b[0]) for b in (["tensorboard"], ["mlflow"])]
    if args.metrics:
        step = step_seconds(args.metrics)
        for r in out:
            r["median_step_s"] = round(step, 4)
            r["bound_percent_of_step"] = round(100 * r["written_us_per_record"] / 1e6 / step, 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
