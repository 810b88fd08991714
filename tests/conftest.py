"""Shared by every test tier: tests/e2e/dagrun.py (Snakemake in a test, and reading a dry run's
plan) is importable as `dagrun` from tests/unit and tests/slurm too.

Under pytest-xdist each worker gets its share of the cores for torch's intra-op threads (unless
OMP_NUM_THREADS is set): two workers on two cores each running two OpenMP threads spent most of
their time waiting on each other (README's test command: 9:03 against 7:10 with one thread a
worker on a 2-core machine; the flex-attention decode test 81 s against 14 s)."""

import contextlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "e2e"))

_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _workers and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))
    if "torch" in sys.modules:  # OpenMP read the environment at torch's import
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture
def engine_settings():
    """engine_settings(decode_step="hf", ...): this process's engine settings (arenaflow.engine)
    from now on in the test, over those set before; the previous ones are back after it."""
    from arenaflow import engine

    with contextlib.ExitStack() as stack:
        yield lambda **settings: stack.enter_context(engine.using(**settings))
