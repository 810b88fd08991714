"""What a running training shows: metrics.jsonl step by step, a log line every 10 steps, the
experiment trackers of config `tracking:` (arenaflow.tracking), and a torch.profiler table of one
step on request (arenaflow.knobs.PROFILE_STEP)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from arenaflow import knobs, tracking

log = logging.getLogger("arenaflow.train")


def start_profile(step: int):
    """A running torch.profiler when knobs.PROFILE_STEP names this step, else None (its table
    goes to runs/{arm}/profile_rank0.txt)."""
    if knobs.get(knobs.PROFILE_STEP) != str(step):
        return None
    from torch.profiler import ProfilerActivity, profile

    prof = profile(
        activities=[ProfilerActivity.CPU]
        + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    )
    prof.start()
    return prof


def finish_profile(prof, path: Path) -> None:
    """Stop the profiler and write its tables: device time first, then host time."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    prof.stop()
    path.parent.mkdir(parents=True, exist_ok=True)
    by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table = prof.key_averages()
    path.write_text(
        table.table(sort_by=by, row_limit=40)
        + "\n"
        + table.table(sort_by="self_cpu_time_total", row_limit=25)
    )


class Progress:
    """What someone watching a run sees: every step appended to runs/{arm}/metrics.jsonl and
    flushed (so `tail -f` follows a running job; final/ gets the whole list only at the end),
    and a log line every 10 steps with tokens/s and the ETA. Rates count this process only: a
    resumed run's earlier steps ran elsewhere, at another speed."""

    def __init__(
        self,
        path: Path,
        resumed: list[dict],
        start: int,
        n_steps: int,
        rank: int,
        tracker: tracking.Run | None = None,
    ):
        self.start, self.n_steps, self.rank = start, n_steps, rank
        self.t0, self.tokens0 = time.time(), resumed[-1]["tokens_seen"] if resumed else 0
        self.tracker = tracker or tracking.Run([], 1, 0.0)
        self.tracked = (self.t0, self.tokens0)  # time and tokens at the tracker's last record
        self.file = None
        if (
            rank == 0
        ):  # rewritten from the checkpoint's steps, so a resumed step is not listed twice
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = path.open("w", encoding="utf-8")
            for m in resumed:
                self.write(m)

    def write(self, m: dict) -> None:
        self.file.write(json.dumps(m, sort_keys=True) + "\n")
        self.file.flush()

    def step(self, m: dict, lrs: dict) -> None:
        if self.rank != 0:
            return
        self.write(m)
        self.track(m, lrs)
        step = m["step"]
        if step % 10 and step not in (1, self.start + 1, self.n_steps):
            return
        took = max(time.time() - self.t0, 1e-9)
        eta = took / (step - self.start) * (self.n_steps - step)
        log.info(
            "step %d/%d | loss %.5f | grad_norm %.4f | lr %s | tok %d | %.0f tok/s | %.1fs "
            "| ETA %.0fs",
            step,
            self.n_steps,
            m["loss"],
            m["grad_norm"] or 0.0,
            {k: f"{v:.2e}" for k, v in lrs.items()},
            m["tokens_seen"],
            (m["tokens_seen"] - self.tokens0) / took,
            m["elapsed_s"],
            eta,
        )

    def track(self, m: dict, lrs: dict) -> None:
        """The step to the trackers, when their throttle lets it through (the last step and a
        held-out evaluation always): tokens/s over the steps since the last record."""
        if not self.tracker or not self.tracker.throttle.due(
            m["step"], force=m["step"] == self.n_steps or "heldout_loss" in m
        ):
            return
        now = time.time()
        rate = (m["tokens_seen"] - self.tracked[1]) / max(now - self.tracked[0], 1e-9)
        self.tracked = (now, m["tokens_seen"])
        keys = ("loss", "grad_norm", "heldout_loss", "margin", "pref_acc")
        self.tracker.log_metrics(
            {
                **{f"train/{k}": m[k] for k in keys if k in m},
                **{f"train/lr/{g}": v for g, v in lrs.items()},
                "train/tokens_per_s": rate,
                "train/tokens_seen": m["tokens_seen"],
            },
            m["step"],
        )

    def close(self) -> None:
        if self.file:
            self.file.close()
        self.tracker.close()
