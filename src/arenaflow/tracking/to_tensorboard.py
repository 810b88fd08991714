"""TensorBoard: one event-file directory per run, <tensorboard.dir>/<lineage>/<name>.

tensorboard's own writer (EventFileWriter, which queues events for a thread of its own) rather
than torch.utils.tensorboard's, which wraps it: a verification or round job imports no torch
(its import took 10 s on a busy 2-core VM, more than such a job's whole wait for its trackers).
The parameters and tags go in as text summaries, since TensorBoard has no parameter table
outside its hparams plugin, which wants every run's keys declared up front."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.summary.writer.event_file_writer import EventFileWriter

TEXT = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))


class Writer:
    def __init__(self, settings: dict, name: str, tags: dict, parent: str | None):
        self.dir = Path(settings["tensorboard"]["dir"]) / name
        self.dir.mkdir(parents=True, exist_ok=True)  # raises here on a directory it cannot write
        self.writer = EventFileWriter(str(self.dir), flush_secs=10)
        self.text("tags", tags)

    def text(self, tag: str, d: dict) -> None:
        """`d` as a markdown table (TensorBoard's text plugin renders markdown)."""
        rows = [f"| {k} | `{json.dumps(v, sort_keys=True)}` |" for k, v in sorted(d.items())]
        table = "\n".join(["| key | value |", "|---|---|", *rows]).encode()
        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[table],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        value = Summary.Value(tag=tag, metadata=TEXT, tensor=tensor)
        self.writer.add_event(Event(wall_time=time.time(), step=0, summary=Summary(value=[value])))

    def log_params(self, params: dict) -> None:
        self.text("params", params)

    def log_metrics(self, metrics: dict, step: int) -> None:
        values = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()])
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=values))

    def close(self) -> None:
        self.writer.close()
