"""Shared fixtures for the unit tests of arenaflow's pure modules."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypers import TINY_LORA

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny model's byte-level ChatML tokenizer, built in-process (no files, no network)."""
    from arenaflow.tinymodel import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def nopad_tokenizer():
    """The tiny model's tokenizer without a pad token, as Llama 3 and some GGUF imports ship."""
    from arenaflow.tinymodel import build_tokenizer

    tok = build_tokenizer()
    tok.pad_token = None
    return tok


def strip_pad_token(src: Path, dst: Path) -> Path:
    """A copy of model directory `src` whose tokenizer has no pad token (the weights are linked,
    not copied); its tokenizer.json's padding goes too, or the backend would still pad."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).symlink_to(f.resolve())
    edits = {
        "tokenizer_config.json": lambda d: d.pop("pad_token", None),
        "tokenizer.json": lambda d: d.update(padding=None),
    }
    for name, edit in edits.items():
        d = json.loads((src / name).read_text(encoding="utf-8"))
        edit(d)
        (dst / name).unlink()
        (dst / name).write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    return dst


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
    from arenaflow import corpora, models
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
