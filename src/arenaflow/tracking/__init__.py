"""Experiment trackers: what a job reports while it runs, to TensorBoard, MLflow or W&B.

Config key `tracking:` (workflow/schemas/config.schema.yaml; docs/tracking.md). arenaflow.config
resolves it once (settings(): defaults filled, paths absolute, the backends' packages checked),
the rules pass it to the jobs as `--tracking-json` (not a param: it changes no output), and a job
opens one run with open_run() and reports through it:

    run = tracking.open_run(settings, "S1", kind="train", params=hyper, tags={...})
    run.log_metrics({"train/loss": 0.41}, step=12)
    run.close()

Each backend (one module each, imported only when asked for) writes on a thread of its own, so a
step never waits for a disk or a server; a backend that fails is warned about once and dropped,
and close() waits for the rest at most 1 % of the run's time so far (Run.close).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from arenaflow.schema import ConfigError, schema_defaults
from arenaflow.tracking.backends import preload, start
from arenaflow.tracking.run import Run, Throttle, close_together

__all__ = [
    "Run",
    "Throttle",
    "close_together",
    "from_json",
    "open_run",
    "preload",
    "require",
    "settings",
    "summary",
]

# backend: (the package it imports, the arenaflow extra that installs it; None: a main dependency)
PACKAGES = {
    "tensorboard": ("tensorboard", None),
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
}


def require(backends, where: str = "tracking/backends") -> None:
    """Refuse, before any job runs, a backend whose package is not installed, naming the package
    and the extra that installs it."""
    for b in backends:
        package, extra = PACKAGES[b]
        if importlib.util.find_spec(package) is None:
            how = f"pip install 'arenaflow[{extra}]'" if extra else f"pip install {package}"
            raise ConfigError(
                f"{where}: tracker {b!r} needs the package {package!r}, which is not installed "
                f"({how}; or drop {b!r} from tracking/backends)"
            )


def settings(section: dict | None, results_dir: str | Path, where: str = "config") -> dict:
    """The `tracking:` section as jobs take it: the schema's defaults filled, the backends'
    directories absolute (relative ones are under results_dir), the lineage named, and every
    backend asked for installed (require)."""
    results = Path(results_dir)
    s = {**schema_defaults("tracking"), **(section or {})}
    for b in PACKAGES:
        s[b] = {**schema_defaults(b), **s.get(b, {})}
    s["lineage"] = s["lineage"] or results.name
    s["tensorboard"]["dir"] = str(results / s["tensorboard"]["dir"])
    s["wandb"]["dir"] = str(results / s["wandb"]["dir"])
    # MLflow 3's file store refuses to open unless asked (mlflow.tracking: it is in maintenance
    # mode), but it is the one store with no server and no database to migrate; to_mlflow opts
    # in for a file: URI only
    s["mlflow"]["tracking_uri"] = s["mlflow"]["tracking_uri"] or (results / "mlruns").as_uri()
    require(s["backends"], f"{where}: key 'tracking/backends'")
    return s


def from_json(text: str | None) -> dict | None:
    """A job's --tracking-json (None: tracking off), read at its start: the backends' modules
    are imported meanwhile (preload), so that the job's end does not wait for them."""
    if not text:
        return None
    s = json.loads(text)
    preload(s["backends"])
    return s


def open_run(
    settings: dict | None,
    name: str,
    *,
    kind: str,
    params: dict | None = None,
    tags: dict | None = None,
    parent: str | None = None,
) -> Run:
    """A run named <lineage>/<name> in every backend of `settings` (None: a run that writes
    nothing), with `params` and `tags` logged as it opens. `kind` (train, sample, verify,
    readout, round) is a tag, and W&B's job type; `parent`: the name of the run this one is a
    child of (MLflow nests it under the run of that name, made if there is none; W&B groups
    by it; TensorBoard has only the directories of `name`)."""
    if not settings or not settings["backends"]:
        return Run([], 0, 0.0)
    full = f"{settings['lineage']}/{name}"
    tags = {"lineage": settings["lineage"], "kind": kind, **(tags or {})}
    parent_full = f"{settings['lineage']}/{parent}" if parent else None
    writers = [
        start(b, settings, full, tags, params or {}, parent_full) for b in settings["backends"]
    ]
    return Run(writers, settings["every_steps"], settings["min_interval_s"])


def summary(
    settings: dict | None,
    name: str,
    *,
    kind: str,
    metrics: dict[int, dict],
    params: dict | None = None,
    tags: dict | None = None,
    parent: str | None = None,
) -> None:
    """A finished job's numbers as one run ({step: {metric: value}}), waiting for the trackers
    at most `flush_s`: a sampling, verification or readout job, a round's summary."""
    if not settings or not settings["backends"]:
        return
    run = open_run(settings, name, kind=kind, params=params, tags=tags, parent=parent)
    for step, m in sorted(metrics.items()):
        run.log_metrics(m, step)
    run.close(settings["flush_s"])
