"""torch's extension-build lock, which a killed build leaves behind (docs/notes.md: DeepSpeed on
CPU).

On CPU, DeepSpeed's init_distributed compiles its shared-memory op (about 90 s cold) under torch's
file lock: `<build dir>/lock`, created by whoever builds and removed when it is done. It records
no owner, and a waiter polls for it to go away, forever. A build killed mid-way (Ctrl-C, a job
killed, the machine restarted) therefore hung every later CPU training, with no log line. Every
venv builds the op anew (its sources' path is part of the version torch hashes), so a killed
build is common on a machine that runs CI in fresh clones.

A live build runs ninja and the compilers with the build directory as their working directory;
a lock with no such process, older than a builder takes to start ninja, was left by a dead one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

NAME = "deepspeed_shm_comm"
GRACE_S = 30.0  # a builder writes its ninja file and starts ninja well within this
RECHECK_S = 1.0  # between ninja's end and the lock's removal a live builder takes milliseconds
STALE_S = 600.0  # where /proc cannot say who works in the directory: older than any build


def lock_path(name: str = NAME) -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False)) / "lock"


def building(directory: Path) -> bool | None:
    """Whether a live process works in `directory`; None where /proc cannot tell."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    target = os.path.realpath(directory)
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd") == target:
                return True
    return False


def _age(lock: Path) -> float | None:
    try:
        return time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return None


def clear_stale(lock: Path) -> Path | None:
    """Remove the build lock `lock` when its builder is gone; the path removed, if any."""
    age = _age(lock)
    if age is None or age < GRACE_S:
        return None
    live = building(lock.parent)
    if live or (live is None and age < STALE_S):
        return None
    if live is False:  # look again: a builder between ninja's end and its release of the lock
        time.sleep(RECHECK_S)
        if _age(lock) is None or building(lock.parent):
            return None
    log.warning(
        "removing %s, %.0f s old, no build working there: a killed build left it", lock, age
    )
    lock.unlink(missing_ok=True)
    return lock


@contextlib.contextmanager
def watched(name: str = NAME, poll_s: float = 5.0):
    """Around a call that may wait on the lock (DeepSpeed's init_distributed on CPU): remove it
    once its builder is gone, also when that builder dies while this process waits."""
    # The path is resolved here: an import on the thread deadlocked with the caller's imports
    # (torch.utils.cpp_extension's setuptools against DeepSpeed's, each holding a module lock).
    lock, stop = lock_path(name), threading.Event()

    def watch() -> None:  # no imports: only the file system
        while not stop.is_set():
            clear_stale(lock)
            stop.wait(poll_s)

    thread = threading.Thread(target=watch, name="build-lock-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
