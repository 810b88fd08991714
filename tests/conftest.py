"""Shared by every test tier: tests/e2e/dagrun.py (Snakemake in a test, and reading a dry run's
plan) is importable as `dagrun` from tests/unit and tests/slurm too."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "e2e"))
