"""MLflow: a run named <lineage>/<name> in the configured experiment, through MlflowClient (no
global active run, so runs of several jobs or threads never mix); a child of the run named
`parent` (created if the experiment holds none) where there is one: a round's parent run and its
arms' child runs."""

from __future__ import annotations

import json
import os
import time

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

# A parameter's value is cut at MLflow's limit (6000 in 3.18: mlflow.utils.validation), a tag's
# below it (8000 there), leaving room for servers with a smaller limit
MAX_PARAM, MAX_TAG = 6000, 5000
PARENT_TAG = "mlflow.parentRunId"


def client(uri: str) -> MlflowClient:
    """A client of `uri`; a file: store is opted into (MLflow 3 refuses it otherwise)."""
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(tracking_uri=uri)


def experiment_id(c: MlflowClient, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    return exp.experiment_id if exp else c.create_experiment(name)


def find_run(c: MlflowClient, exp: str, name: str):
    """The newest run called `name` in the experiment, or None."""
    found = c.search_runs(
        [exp], f"attributes.run_name = '{name}'", max_results=1, order_by=["start_time DESC"]
    )
    return found[0] if found else None


class Writer:
    def __init__(self, settings: dict, name: str, tags: dict, parent: str | None):
        self.c = client(settings["mlflow"]["tracking_uri"])
        exp = experiment_id(self.c, settings["mlflow"]["experiment"])
        tags = {k: str(v)[:MAX_TAG] for k, v in tags.items()}
        if parent:
            p = find_run(self.c, exp, parent) or self.c.create_run(exp, run_name=parent, tags={})
            tags[PARENT_TAG] = p.info.run_id
        self.run_id = self.c.create_run(exp, run_name=name, tags=tags).info.run_id

    def log_params(self, params: dict) -> None:
        self.c.log_batch(
            self.run_id,
            params=[Param(k, _value(v)) for k, v in sorted(params.items())],
        )

    def log_metrics(self, metrics: dict, step: int) -> None:
        ms = int(time.time() * 1000)
        self.c.log_batch(self.run_id, metrics=[Metric(k, v, ms, step) for k, v in metrics.items()])

    def close(self) -> None:
        self.c.set_terminated(self.run_id)


def _value(v) -> str:
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return text[:MAX_PARAM]
