"""A round's registration record and the append-only registry that holds it.

registry_path is nominations/registry/{round}.jsonl; its events are "registered" and "retired",
and the registration in force is the last one registered and not retired since. Appending, which
refuses a changed bar, is arenaflow.rounds.nominate's record_registration.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from arenaflow import io, manifest
from arenaflow.rounds import bar
from arenaflow.rounds.bar import bar_sha256


def utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")


def register(round_id: str, rnd: dict, now: str | None = None) -> dict:
    """The registration record of a round's bar (not yet in any registry)."""
    resolved = bar.clauses(rnd)
    return {
        "round": round_id,
        "bar": rnd["bar"],
        "bar_resolved": resolved,
        "bar_sha256": bar_sha256(resolved),
        "round_config": {k: v for k, v in rnd.items() if k != "bar_resolved"},  # as written
        "registered_utc": now or utcnow(),
        "code": manifest.code_version(),
    }


def registry_path(nominations_dir: str | os.PathLike, round_id: str) -> Path:
    return Path(nominations_dir) / "registry" / f"{round_id}.jsonl"


def read_registry(path: str | os.PathLike) -> list[dict]:
    return io.read_jsonl(path) if Path(path).exists() else []


def active(events: list[dict]) -> dict | None:
    """The registration in force: the last one registered and not retired since."""
    current = None
    for e in events:
        if e["event"] == "registered":
            current = e
        elif e["event"] == "retired" and current and e["bar_sha256"] == current["bar_sha256"]:
            current = None
    return current
