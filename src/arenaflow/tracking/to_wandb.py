"""Weights & Biases: a run named <lineage>/<name>, grouped by lineage, offline unless the config
says online (then the account's credentials are wandb's own affair)."""

from __future__ import annotations

from pathlib import Path

import wandb


class Writer:
    def __init__(self, settings: dict, name: str, tags: dict, parent: str | None):
        w = settings["wandb"]
        Path(w["dir"]).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=w["project"],
            entity=w["entity"],
            mode=w["mode"],
            dir=w["dir"],
            name=name,
            group=parent or settings["lineage"],
            job_type=tags.get("kind"),
            tags=[f"{k}:{v}" for k, v in sorted(tags.items())],
            reinit="create_new",
        )

    def log_params(self, params: dict) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()
