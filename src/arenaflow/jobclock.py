"""Where a job's start-up ends and its work begins: one log line per GPU job when its model is
loaded, and, for benchmarks, one JSON line per event in the file named by $ARENAFLOW_EVENTS.

A GPU job's wall time is start-up (interpreter, imports, model load; for training DeepSpeed's
set-up) plus work (which begins with the first batch or step, where compilation and CUDA-graph
capture happen). Each job calls `loaded(job)` once its model is on the device and `done(job,
tokens=..., seconds=...)` at its end; `job` is the job's output path, as Snakemake lists it.
benchmarks/lineage_gpu.py reads the events to report start-up apart and to measure how busy the
GPU was from the model loaded to the job's end. Without $ARENAFLOW_EVENTS nothing is written
but the log line.
"""

from __future__ import annotations

import json
import os
import sys
import time

from arenaflow import knobs

ENV = knobs.EVENTS
_IMPORTED = time.time()


def process_start() -> float:
    """Wall-clock time at which this process started (Linux /proc: to 10 ms), else the time
    this module was imported."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED


PROCESS_START = process_start()
_MARKS: list[tuple[str, float]] = []  # this process's start-up phases, in order


def adopt(process_start: float) -> None:
    """This process runs a job that started at `process_start` in another process (a fork of
    arenaflow.zygote's server for a client started then): its clock starts there."""
    global PROCESS_START
    PROCESS_START = process_start
    _MARKS.clear()


def event(job: str, name: str, **fields) -> dict:
    """Append {job, event, t, pid, process_start, **fields} to $ARENAFLOW_EVENTS (when set) as
    one line, written in one call, so lines of concurrent jobs do not interleave."""
    rec = {
        "job": job,
        "event": name,
        "t": time.time(),
        "pid": os.getpid(),
        "process_start": PROCESS_START,
        **fields,
    }
    path = knobs.get(ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    return rec


def mark(job: str, phase: str) -> dict:
    """A start-up phase of `job` ended (e.g. 'imports', 'corpus', 'model'): an event, and a
    part of the 'model loaded' line, so that start-up is reported by where it goes."""
    rec = event(job, "mark", phase=phase)
    _MARKS.append((phase, rec["t"]))
    return rec


def phases(end: float) -> list[tuple[str, float]]:
    """(phase, seconds) of start-up up to `end`: from the process start to the first mark, from
    each mark to the next, and 'rest' from the last mark to `end`."""
    names = [p for p, _ in _MARKS] + ["rest"]
    times = [PROCESS_START] + [t for _, t in _MARKS] + [end]
    return [(n, b - a) for n, a, b in zip(names, times, times[1:])]


def loaded(job: str, **fields) -> dict:
    """The model is on the device: start-up ends here. Logs one line, with the phases marked."""
    rec = event(job, "loaded", **fields)
    parts = ", ".join(f"{p} {s:.1f}s" for p, s in phases(rec["t"])) if _MARKS else ""
    print(
        f"arenaflow: {job}: model loaded {rec['t'] - PROCESS_START:.1f}s after the process started"
        + (f" ({parts})" if parts else ""),
        file=sys.stderr,
        flush=True,
    )
    return rec


def done(job: str, tokens: int | None = None, seconds: float | None = None, **fields) -> dict:
    """The job's work is over: `tokens` it processed (generated, or trained on) in `seconds` of
    work (decoding, or the training loop). Logs one line."""
    rec = event(job, "end", tokens=tokens, seconds=seconds, **fields)
    rate = f", {tokens / seconds:.0f} tok/s" if tokens and seconds else ""
    print(
        f"arenaflow: {job}: {tokens} tokens in {seconds or 0:.1f}s{rate}; "
        f"{rec['t'] - PROCESS_START:.1f}s since the process started",
        file=sys.stderr,
        flush=True,
    )
    return rec
