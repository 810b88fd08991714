"""Shared fixtures for the unit tests of arenaflow's pure modules."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny model's byte-level ChatML tokenizer, built in-process (no files, no network)."""
    from arenaflow.tinymodel import build_tokenizer

    return build_tokenizer()
