"""TensorBoard: one event-file directory per run, <tensorboard.dir>/<lineage>/<name>.

tensorboard's own writer (torch.utils.tensorboard.SummaryWriter, which queues events for a thread
of its own); the parameters as a text summary, since TensorBoard has no parameter table outside
its hparams plugin, which wants every run's keys declared up front."""

from __future__ import annotations

import json
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class Writer:
    def __init__(self, settings: dict, name: str, tags: dict, parent: str | None):
        self.dir = Path(settings["tensorboard"]["dir"]) / name
        self.dir.mkdir(parents=True, exist_ok=True)  # raises here on a directory it cannot write
        self.writer = SummaryWriter(log_dir=str(self.dir), flush_secs=10)
        self.writer.add_text("tags", _table(tags), 0)

    def log_params(self, params: dict) -> None:
        self.writer.add_text("params", _table(params), 0)

    def log_metrics(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


def _table(d: dict) -> str:
    """A markdown table (TensorBoard's text plugin renders markdown)."""
    rows = [f"| {k} | `{json.dumps(v, sort_keys=True)}` |" for k, v in sorted(d.items())]
    return "\n".join(["| key | value |", "|---|---|", *rows])
