"""Small file helpers shared by every stage: atomic writes, JSON and JSONL.

Every writer goes through a temporary file in the destination directory and an atomic rename,
so a killed job never leaves a half-written file that a later job could take for complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; outputs are meant to be shared
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a fresh temporary directory; it replaces `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    old = None
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        for p in tmp.rglob("*"):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        old = _set_aside(path)
        os.replace(tmp, path)
    finally:
        if old is not None and not path.exists():
            os.replace(old, path)  # the new one never landed: the old one stays
        for d in (tmp, old):
            if d is not None and d.exists():
                shutil.rmtree(d)


def _set_aside(path: Path) -> Path | None:
    """Move an existing directory aside whole (deleted once the new one is in place): a reader
    then sees the old directory or the new one, never one half deleted by rmtree, which a
    concurrent writer or a kill -9 could otherwise leave."""
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old.tmp", dir=path.parent))
    try:
        os.replace(path, old)  # rename(2) onto an empty directory
    except FileNotFoundError:  # nothing there, or a concurrent writer moved it first
        old.rmdir()
        return None
    return old


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_json(path: str | os.PathLike):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")


def read_jsonl_numbered(
    path: str | os.PathLike, shown: str | None = None
) -> list[tuple[int, dict]]:
    """(line number, row) of a JSONL file, blank lines skipped; a line that is not UTF-8 or not
    a JSON object fails with `shown` (default: the path):line."""
    shown = shown or str(path)
    rows = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{shown}:{line_no}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at "
                    f"column {e.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{shown}:{line_no}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{shown}:{line_no}: expected a JSON object, got {type(row).__name__}"
                )
            rows.append((line_no, row))
    return rows


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSONL file; a line that is not a JSON object fails with path:line."""
    return [row for _, row in read_jsonl_numbered(path)]
