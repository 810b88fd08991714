"""Which module writes each backend; each is imported on its worker's thread, when asked for."""

from __future__ import annotations

import importlib
import threading

from arenaflow.tracking.run import Worker

MODULES = {
    "tensorboard": "arenaflow.tracking.to_tensorboard",
    "mlflow": "arenaflow.tracking.to_mlflow",
    "wandb": "arenaflow.tracking.to_wandb",
}


def start(
    backend: str, settings: dict, name: str, tags: dict, params: dict, parent: str | None
) -> Worker:
    """A worker that opens the run `name` in `backend` on its thread and logs `params` first."""

    def make():
        module = importlib.import_module(MODULES[backend])
        return module.Writer(settings, name, tags, parent)

    worker = Worker(backend, make)
    if params:
        worker.call("log_params", params)
    return worker


def preload(backends) -> None:
    """Import the backends' modules on a thread now (TensorBoard's takes ~1 s, MLflow's several),
    so that a job which starts its run later, after its set-up, does not import in its steps."""
    for b in backends:
        threading.Thread(
            target=importlib.import_module, args=(MODULES[b],), name=f"import-{b}", daemon=True
        ).start()
