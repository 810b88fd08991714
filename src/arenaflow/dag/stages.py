"""Inputs and flags of the stage rules, from pools to bundles, as functions of the resolved
config (arenaflow.config.resolve) and a rule's wildcards; rules/common.smk wires them in."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from arenaflow import chatformat, paths, schema, tracking
from arenaflow.pools import validate as afvalidate
from arenaflow.schema import BASE


def one_of(names) -> str:
    """A wildcard constraint matching exactly these ids (none: nothing)."""
    return "|".join(sorted(names)) or "^$"


def run_dirs(arm: str) -> list[str]:
    """[runs/{arm}/final], or nothing for 'base' (which has no adapter)."""
    return [] if arm == BASE else [paths.run(arm)]


def adapter_flag(dirs: list[str]) -> str:
    return f"--adapter {dirs[0]}" if dirs else ""


def in_repo(repo: Path, path: str) -> str:
    """A config path: absolute as it is, else relative to the workflow's root."""
    return path if Path(path).is_absolute() else str(repo / path)


class Untracked:
    """A piece of a rule's command given as a param that Snakemake does not track: its params
    trigger compares builtin values only (it skips others as unrepresentable), so a change to
    it reruns nothing. For settings that change no output; formatted into the command as is."""

    def __init__(self, text: str):
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __format__(self, spec: str) -> str:
        return format(self.text, spec)


def tracking_flag(cfg: dict) -> Untracked:
    """--tracking-json for the jobs that report to trackers (config `tracking:`), or nothing
    when it asks for none: untracked, since the trackers change no output."""
    t = cfg["tracking"]
    if not t["backends"]:
        return Untracked("")
    unused = set(tracking.PACKAGES) - set(t["backends"])  # the settings of backends not asked for
    t = {k: v for k, v in t.items() if k not in unused}
    return Untracked(f"--tracking-json {shlex.quote(schema.stage_json(t))}")


# ---- pools ---------------------------------------------------------------------------------
def pool_file(cfg: dict, repo: Path, pool: str) -> list[str]:
    """An imported pool's source file, so editing it rebuilds the pool."""
    f = cfg["pools"][pool].get("file")
    return [] if f is None else [in_repo(repo, f)]


def refuse_empty_pools(cfg: dict, results: Path) -> None:
    """Refuse a built pool under `results` that holds no row, naming it, while the DAG is built:
    as an input it would rebuild every corpus and arm after it before a readout failed on it."""
    afvalidate.refuse_empty(Path(results) / paths.pool(p) for p in cfg["pools"])


def pool_excludes(cfg: dict, pool: str) -> list[str]:
    """The built pools whose prompts this pool may not reuse (its `exclude`), built first."""
    return [paths.pool(p) for p in cfg["pools"][pool].get("exclude", [])]


# ---- candidates and corpora ----------------------------------------------------------------
def corpus_pool(cfg: dict, corpus: str) -> str:
    return paths.pool(cfg["corpora"][corpus]["pool"])


def scaffold_marker(cfg: dict, corpus: str) -> str:
    """A scaffolded corpus's marker (its verdicts judge only the answer after it), else ''."""
    scaffold = cfg["corpora"][corpus].get("scaffold")
    return scaffold["marker"] if scaffold else ""


def corpus_candidates(cfg: dict, corpus: str) -> dict:
    """The samples and verdicts a corpus selects from; none for a reference corpus."""
    if cfg["corpora"][corpus]["policy"] == "reference":
        return {}
    return {"samples": paths.samples(corpus), "verdicts": paths.verdicts(corpus)}


def sharded(section: dict, many: bool = True) -> list[str]:
    """The ids of a config section (corpora, evals) whose `shards` is above 1 (with
    many=False: the others), as the rules' wildcard constraints split them between the one-job
    rule and the shard and merge rules."""
    return sorted(i for i, v in section.items() if (v["shards"] > 1) == many)


def sample_shards(cfg: dict, corpus: str) -> list[str]:
    """The parts of a sharded corpus's samples, shard 0 first (rule merge_samples' input)."""
    return paths.shards_of(paths.samples(corpus), cfg["corpora"][corpus]["shards"])


def eval_pools(cfg: dict, corpus: str) -> list[str]:
    """Every evaluation pool, to decontaminate the corpus against (unless it opts out)."""
    if not cfg["corpora"][corpus]["decontaminate"]:
        return []
    return sorted({paths.pool(s["pool"]) for s in cfg["evals"].values()})


def candidate_flags(samples: str | None, verdicts: str | None) -> str:
    return f"--samples {samples} --verdicts {verdicts}" if verdicts else ""


# ---- train and merge -----------------------------------------------------------------------
def mix_flags(arm: dict, arm_file: str) -> str:
    """A mixture's sources and counts (arm `corpus: {id: rows | all}`, in its order: the sources
    are concatenated so) and its file for errors; nothing for an arm that names one corpus."""
    if arm["corpus"] in arm["mix"]:
        return ""
    mix = json.dumps(arm["mix"], separators=(",", ":"))
    return f"--mix-json {shlex.quote(mix)} --arm-file {arm_file}"


def launcher(hyper: dict) -> str:
    """What starts an arm's ranks: one task that starts its own (the Slurm plugin's gpu=N can
    start a script twice). Several nodes: srun starts one task per node, each a torchrun whose
    rendezvous comes from the Slurm environment (arenaflow.train.launch)."""
    n, k = hyper["nproc"], hyper["nodes"]
    if k > 1:
        return (
            f"srun --nodes {k} --ntasks-per-node 1 --kill-on-bad-exit=1 "
            f"python -m arenaflow.train.launch --nproc-per-node {n}"
        )
    return "python" if n == 1 else f"torchrun --standalone --nproc_per_node {n}"


def merge_parents(arm: dict) -> list[str]:
    return [paths.run(p) for p in arm["merge"]["weights"]]


def merge_flags(arm: dict, parent_dirs: list[str]) -> str:
    """--parent ARM=DIR:WEIGHT per parent, from the rule's inputs (a param path would hide them)."""
    w = arm["merge"]["weights"]
    flags = [f"--parent {p}={d}:{w[p]!r}" for p, d in zip(w, parent_dirs)]
    if arm["merge"]["rank"]:
        flags.append(f"--rank {arm['merge']['rank']}")
    return " ".join(flags)


# ---- evals ---------------------------------------------------------------------------------
def readouts(cfg: dict, suite: str, arm: str, regime: str) -> list[str]:
    """Every replicate's readout of an arm in one regime (K per regime)."""
    reps = range(schema.regime(cfg, suite, regime)["replicates"])
    return [paths.readout(suite, arm, regime, r) for r in reps]


def lineage_comparisons(cfg: dict, arm: str) -> list[str]:
    """compare files of `arm` and each of its ancestors against its own init, every suite and
    regime."""
    out = []
    for a in [arm, *cfg["arms"][arm]["lineage"]]:
        init = cfg["arms"][a]["init"]
        for suite, s in cfg["evals"].items():
            out += [paths.compare(suite, regime, a, init) for regime in s["regimes"]]
    return out


def suite_reads(cfg: dict, suite: str) -> list[tuple[str, int]]:
    """(regime, replicate) of every readout of a suite, in the order of its regimes."""
    regimes = cfg["evals"][suite]["regimes"]
    return [(g, r) for g, regime in regimes.items() for r in range(regime["replicates"])]


def suite_readouts(cfg: dict, suite: str) -> list[str]:
    """Output patterns of readout_<suite>: one parquet per regime and replicate, {rarm} open."""
    return [paths.readout(suite, "{rarm}", g, r) for g, r in suite_reads(cfg, suite)]


def readout_shard_outputs(cfg: dict, suite: str) -> list[str]:
    """Output patterns of readout_<suite>_shard: each readout's part, {rarm} and {shard} open."""
    return [paths.shard_of(out, "{shard}") for out in suite_readouts(cfg, suite)]


def readout_shards(cfg: dict, suite: str) -> list[str]:
    """Every shard's part of every readout of readout_<suite>, {rarm} open (the merge's input)."""
    n = cfg["evals"][suite]["shards"]
    return [p for out in suite_readouts(cfg, suite) for p in paths.shards_of(out, n)]


def regime_decoding(cfg: dict, suite: str, regime: str) -> dict:
    """Only decoding keys (a regime's K changing must not rerun the readouts it has), and only
    those the regime sets: the readout takes the others from the schema (decoding_of)."""
    r = schema.regime(cfg, suite, regime)
    return {k: r[k] for k in schema.DECODING_KEYS if k in r}


def readout_plan(cfg: dict, suite: str, arm: str) -> str:
    """readout_<suite>'s --plan for `arm`: each read's decoding, system turn and output. One job
    makes them all: a new regime or replicate reruns the arm's readouts."""
    return schema.stage_json(
        [
            {
                "regime": g,
                "decoding": regime_decoding(cfg, suite, g),
                "replicate": r,
                "system_prompt": schema.system_prompt_of(cfg, suite, g),
                "out": paths.readout(suite, arm, g, r),
            }
            for g, r in suite_reads(cfg, suite)
        ]
    )


def search_readouts(cfg: dict, search: str) -> dict[str, list[str]]:
    """{candidate: readouts} of a prompt search: the arm under each system prompt and none."""
    ps = cfg["prompt_search"][search]
    prefix = f"{ps['regime']}-"
    return {
        g.removeprefix(prefix): readouts(cfg, ps["suite"], ps["arm"], g)
        for g in schema.search_regimes(cfg, search)  # R-none, R-k0, ...: as the budget counts
    }


def search_flags(cfg: dict, search: str, inputs) -> str:
    """--readouts KEY=PATH for every readout, the arm and the candidates' texts as JSON."""
    ps = cfg["prompt_search"][search]
    prompts = {schema.PROMPT_NONE: "", **cfg["evals"][ps["suite"]]["system_prompts"]}
    flags = [f"--readouts {k}={p}" for k in prompts for p in inputs[k]]
    texts = shlex.quote(schema.stage_json(prompts))
    return f"{' '.join(flags)} --arm {ps['arm']} --prompts-json {texts}"


def judged_readout(cfg: dict, read: str, side: str) -> str:
    j = cfg["judged"][read]
    return paths.readout(j["suite"], j[side], j["regime"], j["replicate"])


def judged_scores(cfg: dict, read: str) -> str:
    j = cfg["judged"][read]
    if "scores" not in j:
        raise ValueError(
            f"config key 'judged/{read}/scores' is not set: name the judge's CSV "
            f"(pair,verdict or pair,A,B) for {paths.judged_pairs(read)}"
        )
    return j["scores"]


# ---- bundles -------------------------------------------------------------------------------
def bundle_inputs(cfg: dict, bundle: str, served: str) -> dict:
    """What bundle `bundle` of arm `served` cites: the lineage's runs, corpora and comparisons,
    the nominating round's nomination, the prompt search whose prompt it ships."""
    b = cfg["bundles"][bundle]
    lineage = [served, *cfg["arms"][served]["lineage"]]
    corpora = {c for a in lineage for c in cfg["arms"][a]["mix"]}  # a merge has none
    out = {
        "runs": [paths.run(a) for a in lineage],
        "corpora": [paths.corpus_manifest(c) for c in sorted(corpora)],
        "compare": lineage_comparisons(cfg, served),
    }
    if "round" in b:
        out["nomination"] = paths.nomination(b["round"])
    if isinstance(b["system_prompt"], dict):  # {search: S}: the search's chosen prompt
        out["prompt_search"] = paths.prompt_search(b["system_prompt"]["search"])
    return out


def chat_template_file(cfg: dict) -> list[str]:
    """base.chat_template's file (a resolved path), or none for 'own' (the template is one of
    the base's files) and 'chatml': an input of every job that renders with it."""
    spec = cfg["base"].get("chat_template", chatformat.OWN)
    return [] if spec in (chatformat.OWN, chatformat.CHATML) else [spec]


def template_file(cfg: dict, repo: Path, bundle: str) -> list[str]:
    """The bundle's chat template file, or none for 'chatml' and for 'base' (the template the
    lineage was trained in: chat_template_file)."""
    spec = cfg["bundles"][bundle]["chat_template"]
    if spec == "base":
        return chat_template_file(cfg)
    return [] if spec == "chatml" else [in_repo(repo, spec)]


def bundle_template(cfg: dict, bundle: str) -> str:
    """The bundle's --chat-template when it names no file: 'chatml' or 'base'."""
    return "chatml" if cfg["bundles"][bundle]["chat_template"] == "chatml" else "base"


def bundle_source(cfg: dict, bundle: str) -> str:
    b = cfg["bundles"][bundle]
    return f"--nomination {paths.nomination(b['round'])}" if "round" in b else f"--arm {b['arm']}"
