"""The GPU-minute cost model: what a training job, a generation job (sampling, a readout) and a
finished run cost, from the config's numbers alone (no torch, so that the DAG can be costed while
it is built), and the shape of an arm's estimate (ArmEstimate). arenaflow.budget.ledger applies
it to a resolved config and its results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from arenaflow.schema import PREFERENCE_OBJECTIVES, with_hyper_defaults

# The cost model, in GPU-minutes (a GPU-minute is one allocated GPU for one minute, what
# GrpTRESMins counts):
#
#   training  gpus x (steps x step_s + overhead) / 60, gpus = nproc x nodes
#             steps  = min(max_steps,
#                          epochs x ceil(rows / (micro_batch_size x grad_accum x gpus)));
#                      a remainder of fewer than grad_accum x gpus rows joins the last step
#             rows   = corpora/{c}/stats.json's rows once the corpus is built, else the pool's
#                      prompt count (an upper bound: one kept row per prompt)
#             step_s = row_seconds x micro_batch_size x grad_accum x seq_len / 1024 (ranks run in
#                      parallel); row_seconds is the median measured over the history (wall_time_s
#                      / (optimizer_steps x micro_batch_size x grad_accum x seq_len / 1024)) of runs
#                      of the same base model, else of any run, else `estimate.row_seconds`
#   generation (sampling k per prompt, a readout replicate): 1 GPU x
#             (ceil(prompts x k / batch_size) x max_new_tokens x decode_step_seconds
#              + overhead) / 60; in `shards: N` jobs (arenaflow.shards), each is 1 GPU x (its
#             share of the batches x max_new_tokens x decode_step_seconds + overhead) / 60: the
#             same batches, N overheads
#   a prompt search's readouts (rule readout_search): a readout each, R-none and R-k for each
#             system prompt x replicates, charged to the search's arm
#   an MC guard (rule mc_guard): 1 GPU x (items x choices x decode_step_seconds + overhead) / 60,
#             one forward pass per (item, choice) (arenaflow.evals.mcguard scores them one at a
#             time), charged to each arm of the guard's `arms`
#   an arm    its training + every readout of it not yet on disk (what it takes to judge it) + the
#             prompt-search readouts and MC guards it causes not yet on disk, plus the sampling
#             of its corpus when that is not on disk (shared by the arms that use it)
#   spent     spent_gpu_minutes (outside these results) + measured training history
#             (world_size x (wall_time_s + overhead) / 60) + estimates of readouts and samples
#             already on disk (those jobs record no time) + prompt-search readouts and MC guards on
#             disk, measured (1 GPU x (their recorded `seconds` + overhead) / 60; estimated when a
#             file predates the record)

KTOK = 1024


def gpus(hyper: dict) -> int:
    hyper = with_hyper_defaults(hyper)  # a record's hyperparameters may predate a key
    return int(hyper["nproc"]) * int(hyper["nodes"])


def epoch_steps(rows: int, rows_a_step: int, micro_batches: int) -> int:
    """Optimizer steps of an epoch that trains every row once: one per full global batch of
    `rows_a_step`, and one more for the rest when each of the step's `micro_batches`
    (grad_accum x ranks) gets a row of it; a smaller rest joins the steps. The training loop
    (arenaflow.train.data, which then splits the epoch's rows evenly among the steps) and this
    budget both count with this rule; it lives here so that building the DAG does not import
    torch."""
    full, rest = divmod(rows, rows_a_step)
    return full + int(rest >= micro_batches or full == 0)


def train_steps(rows: int, hyper: dict) -> int:
    """Optimizer steps, as arenaflow.train.data.total_steps counts them."""
    hyper = with_hyper_defaults(hyper)
    micro = hyper["grad_accum"] * gpus(hyper)
    steps = epoch_steps(rows, hyper["micro_batch_size"] * micro, micro) * hyper["epochs"]
    steps = steps if rows else 0
    return min(steps, hyper["max_steps"] or steps)


def row_ktokens(hyper: dict) -> float:
    """Rows of 1024 tokens one rank processes per optimizer step (padded to seq_len); a
    preference row is a pair, both of its sides run through the model."""
    sides = 2 if hyper.get("objective") in PREFERENCE_OBJECTIVES else 1
    return sides * hyper["micro_batch_size"] * hyper["grad_accum"] * hyper["seq_len"] / KTOK


def train_minutes(rows: int, hyper: dict, row_seconds: float, overhead_minutes: float) -> float:
    step_s = row_seconds * row_ktokens(hyper)
    return gpus(hyper) * (train_steps(rows, hyper) * step_s / 60 + overhead_minutes)


def generate_minutes(
    prompts: int,
    k: int,
    batch_size: int,
    max_new_tokens: int,
    decode_step_seconds: float,
    overhead_minutes: float,
    shards: int = 1,
) -> float:
    """One GPU generating k completions per prompt in batches (sampling; a readout: k=1), or
    `shards` one-GPU jobs sharing the batches, each paying the per-job overhead."""
    batches = math.ceil(prompts * k / batch_size) if prompts else 0
    return batches * max_new_tokens * decode_step_seconds / 60 + shards * overhead_minutes


def measured_row_seconds(record: dict) -> float | None:
    h, steps = record.get("hyperparameters") or {}, record.get("optimizer_steps") or 0
    try:
        work = steps * row_ktokens(h)
    except KeyError:
        return None
    return record["wall_time_s"] / work if work and record.get("wall_time_s") else None


def record_minutes(record: dict, overhead_minutes: float) -> float:
    """GPU-minutes a finished training job held: every rank's GPU for its wall time."""
    world = record.get("world_size") or gpus(record.get("hyperparameters") or {})
    return world * (record.get("wall_time_s", 0.0) / 60 + overhead_minutes)


def job_minutes(seconds: float, overhead_minutes: float) -> float:
    """GPU-minutes of a one-GPU job that recorded `seconds` of work (a readout, a guard)."""
    return seconds / 60 + overhead_minutes


@dataclass
class ArmEstimate:
    arm: str
    priority: float
    gpus: int
    rows: int
    steps: int
    train: float
    readouts: float
    corpus: str  # its id, or a mixture's label ('iflensyn:33000,tulu3:all')
    sampling: float  # of its corpus, when not on disk (shared with other arms on it)
    needs: list[str] = field(default_factory=list)  # pending arms it cannot run without
    samplings: dict[str, float] | None = None  # a mixture's: per source corpus still to sample
    search: float = 0.0  # prompt-search readouts of it not yet on disk (rule readout_search)
    guards: float = 0.0  # MC guard runs of it not yet on disk (rule mc_guard)

    @property
    def own(self) -> float:
        return self.train + self.readouts + self.search + self.guards

    def sampled(self) -> dict[str, float]:
        """{corpus: GPU-minutes of sampling it} of each corpus this arm needs sampled."""
        if self.samplings is not None:
            return self.samplings
        return {self.corpus: self.sampling} if self.sampling > 0 else {}
