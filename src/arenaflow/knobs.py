"""Every environment variable arenaflow reads, in one place: hooks for tests and benchmarks, and
plumbing between processes of one run. None of them changes what a job computes; how a job
decodes and trains is config (arenaflow.engine).

- ARENAFLOW_FAIL_AFTER_STEP=N: a training exits right after optimizer step N (and its
  checkpoint), as a preemption would (the fault-injection tests).
- ARENAFLOW_PROBE_LOGITS=FILE: a training writes the first row's logits after its first step
  (tests comparing world sizes).
- ARENAFLOW_PROFILE_STEP=N: a torch.profiler table of training step N beside the run.
- ARENAFLOW_EVENTS=FILE: one JSON line per job event (model loaded, steps, saves) for
  benchmarks/lineage_gpu.py (arenaflow.jobclock).
- ARENAFLOW_SOURCE_COMMIT=SHA: the commit a copy of the code without its git history records in
  manifests (the GPU machine's copy of the working tree).
- ARENAFLOW_NOT_ADMITTED: the arms the main Snakemake process refused under the budget, passed
  to the job processes that re-read the workflow (arenaflow.budget.admission).
- ARENAFLOW_RDZV_PORT: the multi-node rendezvous port (arenaflow.train.launch).
"""

from __future__ import annotations

import os

FAIL_AFTER_STEP = "ARENAFLOW_FAIL_AFTER_STEP"
PROBE_LOGITS = "ARENAFLOW_PROBE_LOGITS"
PROFILE_STEP = "ARENAFLOW_PROFILE_STEP"
EVENTS = "ARENAFLOW_EVENTS"
SOURCE_COMMIT = "ARENAFLOW_SOURCE_COMMIT"
NOT_ADMITTED = "ARENAFLOW_NOT_ADMITTED"
RDZV_PORT = "ARENAFLOW_RDZV_PORT"
ALL = (
    FAIL_AFTER_STEP,
    PROBE_LOGITS,
    PROFILE_STEP,
    EVENTS,
    SOURCE_COMMIT,
    NOT_ADMITTED,
    RDZV_PORT,
)


def get(name: str, env=None) -> str | None:
    """The variable's value ('' counts as unset), from `env` (default: os.environ)."""
    if name not in ALL:
        raise KeyError(f"{name} is not one of arenaflow's environment variables: {ALL}")
    return (os.environ if env is None else env).get(name) or None
