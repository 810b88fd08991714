"""Where the workflow's files live, relative to the results directory (Snakemake's working
directory). One module owns the layout: rules/*.smk use the patterns as `output:` (their wildcard
names are the rules' wildcards, constrained in rules/common.smk), and rules/common.smk, bar.py,
budget.py and the other modules format them with the functions below.
"""

from __future__ import annotations

POOL = "pools/{pool}.jsonl"
CORPUS = "corpora/{corpus}"
RUN = "runs/{arm}/final"
READOUT = "readouts/{suite}/{rarm}/{regime}.r{rep}.parquet"
COMPARE = "compare/{suite}/{regime}/{rarm}__{ref}.json"
NOISE = "noise/{suite}/{regime}/{rarm}.json"
FAILURES = "failures/{suite}/{regime}/{rarm}__{ref}.json"
GUARD = "guards/{guard}/{rarm}.json"
PROMPT_SEARCH = "prompt_search/{search}.json"
REGISTRATION = "nominations/{rnd}.bar.json"
NOMINATION = "nominations/{rnd}.json"
# torch.compile's caches (inductor's FX graphs and autotuning, Triton's binaries), shared by a
# lineage's jobs so that each graph is compiled once per results directory.
COMPILE_CACHE = {"TORCHINDUCTOR_CACHE_DIR": ".cache/inductor", "TRITON_CACHE_DIR": ".cache/triton"}


def pool(pool_id: str) -> str:
    return POOL.format(pool=pool_id)


def corpus(corpus_id: str) -> str:
    return CORPUS.format(corpus=corpus_id)


def run(arm: str) -> str:
    return RUN.format(arm=arm)


def readout(suite: str, arm: str, regime: str, rep: int) -> str:
    return READOUT.format(suite=suite, rarm=arm, regime=regime, rep=rep)


def compare(suite: str, regime: str, cand: str, ref: str) -> str:
    return COMPARE.format(suite=suite, regime=regime, rarm=cand, ref=ref)


def noise(suite: str, regime: str, arm: str) -> str:
    return NOISE.format(suite=suite, regime=regime, rarm=arm)


def failures(suite: str, regime: str, cand: str, ref: str) -> str:
    return FAILURES.format(suite=suite, regime=regime, rarm=cand, ref=ref)


def guard(guard_id: str, arm: str) -> str:
    return GUARD.format(guard=guard_id, rarm=arm)


def prompt_search(search_id: str) -> str:
    return PROMPT_SEARCH.format(search=search_id)


def registration(rnd: str) -> str:
    return REGISTRATION.format(rnd=rnd)


def nomination(rnd: str) -> str:
    return NOMINATION.format(rnd=rnd)
