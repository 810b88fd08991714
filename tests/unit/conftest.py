"""Shared fixtures for the unit tests of arenaflow's pure modules."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypers import TINY_LORA
from realmodel import strip_pad_token

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny model's byte-level ChatML tokenizer, built in-process (no files, no network)."""
    from arenaflow.bases.tinymodel import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def nopad_tokenizer():
    """The tiny model's tokenizer without a pad token, as Llama 3 and some GGUF imports ship."""
    from arenaflow.bases.tinymodel import build_tokenizer

    tok = build_tokenizer()
    tok.pad_token = None
    return tok


@pytest.fixture(scope="session")
def strip_pad():
    """strip_pad_token, for module-scoped fixtures."""
    return strip_pad_token


def train_arm_cli(
    root: Path,
    base: Path,
    rows: list[dict],
    system: str,
    *,
    corpus_id: str = "c",
    timeout: int = 600,
    threads: int = 1,
    nproc: int = 1,
    **hyper,
) -> subprocess.CompletedProcess:
    """Arm A trained from `base` through the entry point (python -m arenaflow.train), as the
    workflow runs it: corpus root/corpora/{corpus_id} is built from `rows` with the base's own
    tokenizer, the run goes to root/runs/A/final with TINY_LORA updated by `hyper`, on `nproc`
    ranks (torchrun for several). A failed run fails the test with its log's tail; the finished
    process is returned (its log is stderr)."""
    from arenaflow import models
    from arenaflow.corpora import build as corpora
    from arenaflow.train import argv as train_argv

    corpus = root / "corpora" / corpus_id
    corpora.build(corpus, rows, models.load_tokenizer(base), system, {})
    proc = subprocess.run(
        train_argv(
            "A",
            {**TINY_LORA, **hyper},
            corpus,
            base,
            root / "runs/A/final",
            nproc=nproc,
            extra=["--corpus-id", corpus_id],
        ),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": str(threads)},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return proc


@pytest.fixture(scope="session")
def train_arm():
    """train_arm_cli, for module-scoped fixtures."""
    return train_arm_cli
