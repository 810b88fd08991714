"""Shared by every test tier: tests/e2e/dagrun.py (Snakemake in a test, and reading a dry run's
plan) is importable as `dagrun` from tests/unit and tests/slurm too.

Under pytest-xdist each worker gets its share of the cores for torch's intra-op threads (unless
OMP_NUM_THREADS is set): two workers on two cores each running two OpenMP threads spent most of
their time waiting on each other (README's test command: 9:03 against 7:10 with one thread a
worker on a 2-core machine; the flex-attention decode test 81 s against 14 s).

Every test collected, before `-m` and `-k` deselect any, is kept with its gpu marker for
tests/unit/test_gpu_tier.py (fixture collected_tests; --collected-json writes them to a file)."""

import contextlib
import json
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


_COLLECTED = pytest.StashKey[list]()


def pytest_addoption(parser):
    parser.addoption(
        "--collected-json",
        metavar="PATH",
        help="write every collected test's id, gpu marker and skip marker to PATH as JSON",
    )


def _skipped_here(item) -> bool:
    """Skipped in this process by a marker (skip, or a skipif whose condition holds)."""
    if item.get_closest_marker("skip"):
        return True
    conditions = (
        m.args[0] if m.args else m.kwargs.get("condition") for m in item.iter_markers("skipif")
    )
    return any(c is True for c in conditions)


@pytest.hookimpl(tryfirst=True)  # before the markers plugin's -m and the -k deselection
def pytest_collection_modifyitems(config, items):
    records = [
        {
            "id": i.nodeid,
            "gpu": i.get_closest_marker("gpu") is not None,
            "skipped": _skipped_here(i),
        }
        for i in items
    ]
    config.stash[_COLLECTED] = records
    if config.getoption("collected_json"):
        Path(config.getoption("collected_json")).write_text(json.dumps(records))


@pytest.fixture(scope="session")
def collected_tests(request) -> list[dict]:
    """Every test this session collected (deselected ones too): id, gpu, skipped."""
    return request.config.stash.get(_COLLECTED, [])
