"""Where the workflow's files live, relative to the results directory (Snakemake's working
directory). One module owns the layout: rules/*.smk use the patterns as `output:` (their wildcard
names are the rules' wildcards, constrained in rules/common.smk), and arenaflow.dag, the bar, the
budget and the other modules format them with the functions below. Logs are the exception: one
per job, `logs/<stage>/<key>.log`, written out in each rule and read by no code.
"""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

POOL = "pools/{pool}.jsonl"
SAMPLES = "candidates/{corpus}/samples.jsonl"
VERDICTS = "candidates/{corpus}/verdicts.jsonl"
# each one's sidecar manifest (arenaflow.manifest.sidecar: the same name, .manifest.json)
POOL_MANIFEST = "pools/{pool}.manifest.json"
SAMPLES_MANIFEST = "candidates/{corpus}/samples.manifest.json"
VERDICTS_MANIFEST = "candidates/{corpus}/verdicts.manifest.json"
CORPUS = "corpora/{corpus}"
CORPUS_ROWS = CORPUS + "/rows.jsonl"
CORPUS_STATS = CORPUS + "/stats.json"
CORPUS_MANIFEST = CORPUS + "/manifest.json"
RUN_UNDER_RUNS = "{arm}/final"  # under a runs directory a job is given (--runs runs)
RUN = "runs/" + RUN_UNDER_RUNS
READOUT = "readouts/{suite}/{rarm}/{regime}.r{rep}.parquet"
COMPARE = "compare/{suite}/{regime}/{rarm}__{ref}.json"
NOISE = "noise/{suite}/{regime}/{rarm}.json"
FAILURES = "failures/{suite}/{regime}/{rarm}__{ref}.json"
GUARD = "guards/{guard}/{rarm}.json"
PROMPT_SEARCH = "prompt_search/{search}.json"
REGISTRATION = "nominations/{rnd}.bar.json"
REGISTRY = "nominations/registry/{rnd}.jsonl"  # append-only: registrations and retirements
NOMINATION = "nominations/{rnd}.json"
JUDGED_DIR = "judged/{read}"  # the blinded packet
JUDGED_PAIRS = JUDGED_DIR + "/pairs.jsonl"
JUDGED_KEY = "judged/{read}.key.json"
JUDGED = "judged/{read}.json"
ROUND_STATUS = "rounds/{rnd}.json"
ROUND_PLOT = "rounds/{rnd}.png"
REPORT_DIR = "reports/{rnd}"  # a round's page: its figures and nomination table
BUDGET_TABLE = "budget/table.{ext}"  # json, md, html
BUNDLE = "bundles/{bundle}"
# torch.compile's caches (inductor's FX graphs and autotuning, Triton's binaries), shared by a
# lineage's jobs so that each graph is compiled once per results directory.
COMPILE_CACHE = {"TORCHINDUCTOR_CACHE_DIR": ".cache/inductor", "TRITON_CACHE_DIR": ".cache/triton"}


def parse(pattern: str, path: str | os.PathLike) -> dict | None:
    """The wildcards `path` fills in `pattern` ({"suite": "math", ...}), read from as many of
    its trailing components as the pattern has; None where it does not match."""
    regex = "".join(
        re.escape(literal) + (f"(?P<{field}>[^/]+?)" if field else "")
        for literal, field, _, _ in string.Formatter().parse(pattern)
    )
    tail = "/".join(Path(path).parts[-(pattern.count("/") + 1) :])
    m = re.fullmatch(regex, tail)
    return m.groupdict() if m else None


def pool(pool_id: str) -> str:
    return POOL.format(pool=pool_id)


def samples(corpus_id: str) -> str:
    return SAMPLES.format(corpus=corpus_id)


def verdicts(corpus_id: str) -> str:
    return VERDICTS.format(corpus=corpus_id)


def shard_id(i: int, n: int) -> str:
    """Shard i (from 0) of n, as its file and the rules' {shard} wildcard name it: '2-of-7'."""
    return f"{i}-of-{n}"


def shard_of(output: str, shard: str) -> str:
    """The part of `output` (a path or a rule's pattern) that shard `shard` writes:
    candidates/C/samples.jsonl, '0-of-3' -> candidates/C/samples.shards/0-of-3.jsonl."""
    p = Path(output)
    stem, suffix = p.name.rsplit(".", 1)
    return str(p.parent / f"{stem}.shards" / f"{shard}.{suffix}")


def shards_of(output: str, n: int) -> list[str]:
    """Every shard's part of `output`, in order (what the merge concatenates)."""
    return [shard_of(output, shard_id(i, n)) for i in range(n)]


# A sampling shard's part of the samples, and its manifest (rule sample_candidates_shard)
SAMPLES_SHARD = shard_of(SAMPLES, "{shard}")
SAMPLES_SHARD_MANIFEST = SAMPLES_SHARD.removesuffix(".jsonl") + ".manifest.json"


def corpus(corpus_id: str) -> str:
    return CORPUS.format(corpus=corpus_id)


def corpus_manifest(corpus_id: str) -> str:
    return CORPUS_MANIFEST.format(corpus=corpus_id)


def run(arm: str) -> str:
    return RUN.format(arm=arm)


def run_under(runs: str | os.PathLike, arm: str) -> Path:
    """An arm's run directory under the runs directory `runs` (a job's --runs)."""
    return Path(runs) / RUN_UNDER_RUNS.format(arm=arm)


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


def registry(rnd: str) -> str:
    return REGISTRY.format(rnd=rnd)


def nomination(rnd: str) -> str:
    return NOMINATION.format(rnd=rnd)


def judged_dir(read: str) -> str:
    return JUDGED_DIR.format(read=read)


def judged_pairs(read: str) -> str:
    return JUDGED_PAIRS.format(read=read)


def round_plot(rnd: str) -> str:
    return ROUND_PLOT.format(rnd=rnd)


def report_dir(rnd: str) -> str:
    return REPORT_DIR.format(rnd=rnd)


def report_page(name: str) -> str:
    """A file of a round's page, {rnd} left open: an output pattern of rule round_report."""
    return f"{REPORT_DIR}/{name}"


def budget_table(ext: str) -> str:
    return BUDGET_TABLE.format(ext=ext)


def bundle(bundle_id: str) -> str:
    return BUNDLE.format(bundle=bundle_id)
