"""What a user sees while training runs: runs/{arm}/metrics.jsonl grows step by step (a killed
run leaves the steps it finished), a resumed run lists each step once, and the log shows
tokens/s and the ETA."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypers import TINY_LORA

from arenaflow import io
from arenaflow.bases import tinymodel
from arenaflow.corpora import build as corpora
from arenaflow.pools import math as mathpool
from arenaflow.train import argv as train_argv

BASE = Path(__file__).resolve().parents[2] / "models/tiny-arith"
HYPER = {**TINY_LORA, "max_steps": 3, "checkpoint_every": 2}


def train(out: Path, corpus: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        train_argv(out.parent.name, HYPER, corpus, BASE, out),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "c"
    corpora.build(
        out,
        mathpool.generate(12, 2, "train", {"add": 1}, "p"),
        tinymodel.build_tokenizer(),
        tinymodel.SYSTEM_PROMPT,
        {},
    )
    return out


def test_metrics_are_streamed_while_training_and_a_resumed_run_lists_each_step_once(
    corpus, tmp_path
):
    out = tmp_path / "A" / "final"
    live = out.parent / "metrics.jsonl"
    cut = train(out, corpus, env={"ARENAFLOW_FAIL_AFTER_STEP": "2"})
    assert cut.returncode == 75 and not out.exists(), cut.stderr[-3000:]
    assert [m["step"] for m in io.read_jsonl(live)] == [1, 2]  # written as they ran, not at the end
    first = io.read_jsonl(live)
    events = tmp_path / "events.jsonl"
    again = train(out, corpus, env={"ARENAFLOW_EVENTS": str(events)})
    assert again.returncode == 0, again.stderr[-3000:]
    # where a job's time goes (benchmarks/lineage_gpu.py): load, steps, then the save by parts
    order = [e["event"] for e in io.read_jsonl(events) if e["event"] != "mark"]
    assert order == ["loaded", "trained", "weights_saved", "committed", "end"], order
    assert [m["step"] for m in io.read_jsonl(live)] == [1, 2, 3]
    assert io.read_jsonl(live)[:2] == first and io.read_jsonl(live) == io.read_jsonl(
        out / "metrics.jsonl"
    )
    # each step lists its forward passes as collate padded them: the step's rows, at most
    # seq_len wide, holding every token the step counted
    seen = 0
    for m in io.read_jsonl(live):
        shapes, tokens = m["micro_batches"], m["tokens_seen"] - seen
        seen = m["tokens_seen"]
        assert len(shapes) == HYPER["grad_accum"], m
        assert sum(rows for rows, _ in shapes) == HYPER["micro_batch_size"] * HYPER["grad_accum"]
        assert all(0 < width <= HYPER["seq_len"] for _, width in shapes), m
        assert tokens <= sum(rows * width for rows, width in shapes), m
    line = next(
        x for x in again.stderr.splitlines() if "step 3/3 |" in x
    )  # a resumed run's first step logs
    assert "tok/s" in line and "ETA 0s" in line
