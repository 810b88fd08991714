# Config validation and lineage resolution happen here, before any job runs; a bad config
# stops `snakemake -n` with one message naming the file and key (arenaflow.config).
# Every input and param function of the rules lives here, by stage (rules/<stage>.smk holds
# rules only), so each rule file reads as its jobs.
import json
import os
import shlex
from pathlib import Path

from snakemake.logging import logger

from arenaflow.rounds import bar as afbar
from arenaflow import config as afconfig
from arenaflow import schema as afschema
from arenaflow.rounds import continual as afcontinual
from arenaflow.rounds import nominate as afnominate
from arenaflow import paths as afpaths
from arenaflow import zygote as afzygote

REPO = Path(workflow.basedir)
try:
    CFG = afconfig.resolve(
        config,
        repo_root=REPO,
        schema_dir=REPO / "workflow" / "schemas",
        config_file=afconfig.files_label(workflow.overwrite_configfiles or [MERGED_OVER]),
        sources=[*([UNDER] if UNDER else []), *workflow.overwrite_configfiles],
    )
except afconfig.ConfigError as e:
    raise WorkflowError(f"arenaflow config error: {e}") from None
# as resolved, before admission drops refused candidates (the budget table's job reads it)
CFG_JSON = afschema.stage_json(CFG)
# Every rule's command starts with this: nothing, or the fork server's client (config
# `fork_server`, arenaflow.zygote). Not a param: it changes no output, so it reruns nothing.
ZYGOTE = afzygote.command(CFG.get("fork_server"))


# Jobs inherit these (local runs, and sbatch's default --export=ALL): a lineage's sampling,
# readout and training jobs compile each graph once. A cache set in the environment wins.
for _var, _dir in afpaths.COMPILE_CACHE.items():
    os.environ.setdefault(_var, str(REPO / CFG["results_dir"] / _dir))


# Absolute, or the Slurm executor resolves paths against results/ twice
# (docs/notes.md#workdir-is-absolute).
workdir: str(REPO / CFG["results_dir"])


BASE = CFG["base"]["path"]
BASE_FILES = sorted(str(p) for p in Path(BASE).iterdir() if p.is_file())
ARM_IDS = sorted(CFG["arms"])
TRAINED_IDS = sorted(a for a, v in CFG["arms"].items() if v["kind"] == afschema.TRAINED)
MERGED_IDS = sorted(
    a for a, v in CFG["arms"].items() if v["kind"] in (afschema.MERGE, afschema.DOSE)
)
NOMINEE_IDS = sorted(a for a, v in CFG["arms"].items() if v["kind"] == afschema.NOMINEE)
READOUT_ARMS = ["base", *ARM_IDS]
# a prompt search's regimes (R-<prompt>, R-none): read by rule readout_search, one job each
SEARCH_REGIMES = sorted({g for s in CFG["evals"].values() for g in s.get("prompt_regimes", {})})


def base_dir(wc, input):
    """The base model's directory, from the rule's `base` input (a path param would hide it)."""
    return str(Path(input.base[0]).parent)


def ids(names):
    return "|".join(sorted(names)) or "^$"


wildcard_constraints:
    pool=ids(CFG["pools"]),
    corpus=ids(CFG["corpora"]),
    arm=ids(ARM_IDS),
    suite=ids(CFG["evals"]),
    rnd=ids(CFG["rounds"]),
    bundle=ids(CFG["bundles"]),
    read=ids(CFG["judged"]),
    guard=ids(CFG.get("mc_guards", {})),
    search=ids(CFG.get("prompt_search", {})),
    rarm=ids(READOUT_ARMS),
    ref=ids(READOUT_ARMS),
    regime="[A-Za-z0-9][A-Za-z0-9_-]*",
    rep="[0-9]+",


def as_json(section):
    return afschema.stage_json(section)


def run_dir(arm):
    """runs/{arm}/final, or nothing for 'base' (which has no adapter)."""
    return [] if arm == "base" else [afpaths.run(arm)]


def adapter_flag(paths):
    return f"--adapter {paths[0]}" if paths else ""


def readouts(suite, arm, regime):
    reps = range(afconfig.regime(CFG, suite, regime)["replicates"])  # per regime (config.py)
    return [afpaths.readout(suite, arm, regime, r) for r in reps]


def lineage_comparisons(arm):
    """compare files of `arm` and each of its ancestors against its own init, every suite/regime."""
    out = []
    for a in [arm, *CFG["arms"][arm]["lineage"]]:
        init = CFG["arms"][a]["init"]
        for suite, s in CFG["evals"].items():
            out += [afpaths.compare(suite, regime, a, init) for regime in s["regimes"]]
    return out


# The GPU-minute budget (config `budget:`, arenaflow.budget.ledger). The train rule's input function
# calls budget_gate for every arm the DAG holds, while the DAG is built, before any job is
# submitted. Stateless: an input function cannot see which targets were asked for, so each arm
# is costed with what any DAG holding it must also run (its pending lineage) and with the other
# pending arms of every round that names it, with their lineages (Budget.gate_arms); a run that
# would overrun the budget is refused there, naming the arm, its estimate and the budget left.
# Unlike the set it replaces (arms seen so far in this DAG), it does not add up independent
# lineages asked for together (two targets in no common round): run `python -m arenaflow.budget.plan`
# for those. Not re-checked inside a submitted job (the decision was made before sbatch), nor by
# --touch or --report (no executor).
from arenaflow.budget import ledger as afbudget

BUDGET = afbudget.Budget(CFG, results=REPO / CFG["results_dir"]) if "budget" in CFG else None

# Admission arm by arm, as Slurm's GrpTRESMins (arenaflow.budget.admission): before the DAG is built,
# pending arms are admitted in priority order while they fit under the cap; a refused one (and
# any that requires it) is dropped from its rounds' candidates, the rest of the lineage runs, and
# budget/table.json records the refusal. The main process decides from the results on disk when
# it starts and passes the arms it did not admit to its jobs (a registered envvar): a job process
# (Slurm) re-parses this file later, when a finished arm's measured cost may let a refused one
# fit, and would otherwise judge a round on other candidates than the main process planned.
from arenaflow.budget import admission as afadmission

ADMISSION = {}
if BUDGET is not None:
    if workflow.is_main_process or afadmission.ENV not in os.environ:
        ADMISSION = afadmission.admit(BUDGET)
        os.environ[afadmission.ENV] = afadmission.to_env(ADMISSION)
    else:
        ADMISSION = afadmission.from_env(os.environ[afadmission.ENV], BUDGET)
    workflow.register_envvars(afadmission.ENV)
for _note in afadmission.drop_refused(CFG, ADMISSION):
    if workflow.is_main_process:
        logger.warning(_note)


def budget_gate(wc):
    if (
        BUDGET is None
        or not workflow.is_main_process
        or workflow.executor_plugin is None
        or workflow.touch
    ):
        return []
    BUDGET.refresh()  # a DAG update after a checkpoint sees what has run since
    try:
        BUDGET.check(BUDGET.gate_arms(wc.arm), wc.arm)
    except afbudget.BudgetError as e:
        raise WorkflowError(str(e)) from None
    # it fits alone, but arms of higher priority were admitted first (arenaflow.budget.admission)
    decision = ADMISSION.get(wc.arm, {})
    if decision.get("status") in (afadmission.REFUSED, afadmission.BLOCKED):
        raise WorkflowError(
            f"GPU-minute budget: arm {wc.arm!r} would overrun the budget and was not admitted: "
            f"{decision['reason']}. Nothing was submitted. Give it a higher `priority:` than "
            "the arms admitted before it, or raise budget.gpu_minutes if the allocation allows."
        )
    return []


# ---- rules/pools.smk ----------------------------------------------------------


def pool_file(wc):
    """An imported pool's source file, so editing it rebuilds the pool."""
    f = CFG["pools"][wc.pool].get("file")
    return [] if f is None else [f if Path(f).is_absolute() else str(REPO / f)]


def pool_excludes(wc):
    """The built pools whose prompts this pool may not reuse (its `exclude`), so they are built
    first and passed as --exclude."""
    return [afpaths.pool(p) for p in CFG["pools"][wc.pool].get("exclude", [])]


# ---- rules/candidates.smk -----------------------------------------------------


def corpus_pool(wc):
    return afpaths.pool(CFG["corpora"][wc.corpus]["pool"])


def scaffold_marker(wc):
    """A scaffolded corpus's marker (its verdicts judge only the answer after it), else ''."""
    scaffold = CFG["corpora"][wc.corpus].get("scaffold")
    return scaffold["marker"] if scaffold else ""


# ---- rules/corpora.smk --------------------------------------------------------


def corpus_candidates(wc):
    if CFG["corpora"][wc.corpus]["policy"] == "reference":
        return {}
    return {
        "samples": f"candidates/{wc.corpus}/samples.jsonl",
        "verdicts": f"candidates/{wc.corpus}/verdicts.jsonl",
    }


def eval_pools(wc):
    """Every evaluation pool, to decontaminate the corpus against (unless it opts out)."""
    if not CFG["corpora"][wc.corpus]["decontaminate"]:
        return []
    return sorted({afpaths.pool(s["pool"]) for s in CFG["evals"].values()})


def candidate_flags(wc, input):
    if "verdicts" not in input.keys():
        return ""
    return f"--samples {input.samples} --verdicts {input.verdicts}"


# ---- rules/train.smk ----------------------------------------------------------


def arm(wc):
    return CFG["arms"][wc.arm]


def arm_hyper(wc):
    """The arm's hyper with arm.schema.yaml's defaults under it, for its resources; its param is
    the hyper as resolved (a default written into it would rerun the arm)."""
    return afschema.with_hyper_defaults(arm(wc)["hyper"])


def arm_nodes(wc):
    return arm_hyper(wc)["nodes"]


def mix_flags(wc, input):
    """A mixture's sources and counts (arm `corpus: {id: rows | all}`), and its file for errors;
    nothing for an arm that names one corpus."""
    a = arm(wc)
    if a["corpus"] in a["mix"]:  # named by its id, not a mixture
        return ""
    return f"--mix-json {shlex.quote(as_json_ordered(a['mix']))} --arm-file {input.arm_file}"


def as_json_ordered(section):
    """JSON keeping the keys' order (a mixture's sources are concatenated in it)."""
    return json.dumps(section, separators=(",", ":"))


def launcher(wc):
    # One task that starts its own ranks: the Slurm plugin's gpu=N can start a script twice.
    # Several nodes: srun starts one task per node, each a torchrun whose rendezvous comes from
    # the Slurm environment (arenaflow.train.launch: first host of SLURM_JOB_NODELIST, SLURM_NNODES,
    # SLURM_NODEID).
    n, k = arm_hyper(wc)["nproc"], arm_nodes(wc)
    if k > 1:
        return (
            f"srun --nodes {k} --ntasks-per-node 1 --kill-on-bad-exit=1 "
            f"python -m arenaflow.train.launch --nproc-per-node {n}"
        )
    return "python" if n == 1 else f"torchrun --standalone --nproc_per_node {n}"


# ---- rules/merge.smk ----------------------------------------------------------


def merge_parents(wc):
    return [afpaths.run(p) for p in arm(wc)["merge"]["weights"]]


def merge_flags(wc, input):
    """--parent ARM=DIR:WEIGHT per parent, from the rule's inputs (a param path would hide them)."""
    w = arm(wc)["merge"]["weights"]
    flags = [f"--parent {p}={d}:{w[p]!r}" for p, d in zip(w, input.parents)]
    if arm(wc)["merge"]["rank"]:
        flags.append(f"--rank {arm(wc)['merge']['rank']}")
    return " ".join(flags)


# ---- rules/continual.smk ------------------------------------------------------


def continual_walk(wc):
    """The nominations rounds/{rnd}.json waits on: the template's rounds up to rnd, in order,
    each asked for only once the stop rules let it run (arenaflow.rounds.continual.stop_reason), so a
    stopped round's jobs are never built. A declared round: its own nomination."""
    rounds = afcontinual.template_rounds(CFG)
    if wc.rnd not in rounds:
        return {"nominations": [afpaths.nomination(wc.rnd)], "note": ""}
    stop, noms, kept = CFG["continual"].get("stop", {}), [], []
    for i, r in enumerate(rounds[: rounds.index(wc.rnd) + 1]):
        reason = afcontinual.stop_reason(rounds, i, kept, stop, over_budget)
        if reason:
            return {"nominations": noms, "note": reason}
        noms.append(checkpoints.nominate.get(rnd=r).output[0])
        kept.append(afnominate.load_sealed(noms[-1])["promoted"] == CFG["rounds"][r]["incumbent"])
    return {"nominations": noms, "note": ""}


def over_budget(rnd):
    """Why the budget refuses round `rnd` (its candidates with what they need), or None."""
    if BUDGET is None or not CFG["continual"].get("stop", {}).get("budget", True):
        return None
    BUDGET.refresh()
    arms = sorted({a for c in CFG["rounds"][rnd]["candidates"] for a in BUDGET.gate_arms(c)})
    cost, left = BUDGET.cost(arms), BUDGET.left()
    if cost > left:
        return (
            f"stopped: round {rnd} needs {cost:.1f} GPU-minutes, {left:.1f} are left of the budget"
        )
    return None


# ---- rules/evals.smk ----------------------------------------------------------


def suite(wc):
    return CFG["evals"][wc.suite]


def suite_reads(suite_id):
    """(regime, replicate) of every readout of a suite, in the order of its regimes."""
    regimes = CFG["evals"][suite_id]["regimes"]
    return [(g, r) for g, regime in regimes.items() for r in range(regime["replicates"])]


def suite_readouts(suite_id):
    """Output patterns of readout_<suite>: one parquet per regime and replicate, {rarm} open."""
    return [afpaths.readout(suite_id, "{rarm}", g, r) for g, r in suite_reads(suite_id)]


def readout_plan(suite_id, output):
    """readout_<suite>'s --plan: each read's decoding (regime_decoding) and system turn. One job
    makes them all: a new regime or replicate reruns the arm's readouts."""
    return as_json(
        [
            {
                "regime": g,
                "decoding": regime_decoding(suite_id, g),
                "replicate": r,
                "system_prompt": afconfig.system_prompt_of(CFG, suite_id, g),
                "out": out,
            }
            for (g, r), out in zip(suite_reads(suite_id), output)
        ]
    )


def regime_decoding(suite_id, rid):
    # Only decoding keys: changing a regime's K must not rerun the readouts it already has.
    # Only those the regime sets: the readout takes the others from the schema (decoding_of).
    regime = afconfig.regime(CFG, suite_id, rid)
    return {k: regime[k] for k in afschema.DECODING_KEYS if k in regime}


def decoding(wc):
    return as_json(regime_decoding(wc.suite, wc.regime))


def readout_system(wc):
    """The system turn of this regime's readouts: its own `system_prompt`, else the config's."""
    return afconfig.system_prompt_of(CFG, wc.suite, wc.regime)


def search_readouts(wc):
    """{candidate: readouts} of a prompt search: the arm under each system prompt and none."""
    ps = CFG["prompt_search"][wc.search]
    regimes = afconfig.search_regimes(CFG, wc.search)  # R-none, R-k0, ...: as the budget counts
    prefix = f"{ps['regime']}-"
    return {g.removeprefix(prefix): readouts(ps["suite"], ps["arm"], g) for g in regimes}


def search_flags(wc, input):
    """--readouts KEY=PATH for every readout, the arm and the candidates' texts as JSON."""
    ps = CFG["prompt_search"][wc.search]
    prompts = {afconfig.PROMPT_NONE: "", **CFG["evals"][ps["suite"]]["system_prompts"]}
    flags = [f"--readouts {k}={p}" for k in prompts for p in input[k]]
    return f"{' '.join(flags)} --arm {ps['arm']} --prompts-json {shlex.quote(as_json(prompts))}"


def guard_items(wc):
    """A multiple-choice guard's items file (relative to the workflow's root)."""
    f = CFG["mc_guards"][wc.guard]["items"]
    return f if Path(f).is_absolute() else str(REPO / f)


# ---- rules/judged.smk ---------------------------------------------------------


def judged(wc):
    return CFG["judged"][wc.read]


def judged_readout(wc, side):
    j = judged(wc)
    return afpaths.readout(j["suite"], j[side], j["regime"], j["replicate"])


def judged_scores(wc):
    j = judged(wc)
    if "scores" not in j:
        raise ValueError(
            f"config key 'judged/{wc.read}/scores' is not set: name the judge's CSV "
            f"(pair,verdict or pair,A,B) for judged/{wc.read}/pairs.jsonl"
        )
    return j["scores"]


# ---- rules/nominate.smk -------------------------------------------------------


def replicates_of(suite, regime):
    return CFG["evals"][suite]["regimes"][regime]["replicates"]


def round_needs(wc):
    """compare and noise JSONs the round's bar reads, and the candidate readouts it judges."""
    return afbar.requirements(CFG["rounds"][wc.rnd], replicates_of)


# ---- rules/bundles.smk --------------------------------------------------------


def bundle_arm(wc):
    """The bundle's arm; for a round, read from the nomination once the checkpoint has run, and
    only from a sealed one (a hand edit stops the DAG here). Whether the files it judged are
    unchanged is checked when the bundle is built: a readout that is gone or remade here reruns
    the nomination first."""
    b = CFG["bundles"][wc.bundle]
    if "arm" in b:
        return b["arm"]
    path = checkpoints.nominate.get(rnd=b["round"]).output[0]
    try:
        return afnominate.load_sealed(path)["promoted"]
    except afnominate.SealError as e:
        raise WorkflowError(f"arenaflow: bundle {wc.bundle}: {e}") from None


def bundle_inputs(wc):
    b, served = CFG["bundles"][wc.bundle], bundle_arm(wc)
    lineage = [served, *CFG["arms"][served]["lineage"]]
    corpora = {c for a in lineage for c in CFG["arms"][a]["mix"]}  # a merge has none
    out = {
        "runs": [afpaths.run(a) for a in lineage],
        "corpora": [f"corpora/{c}/manifest.json" for c in sorted(corpora)],
        "compare": lineage_comparisons(served),
    }
    if "round" in b:
        out["nomination"] = afpaths.nomination(b["round"])
    if isinstance(b["system_prompt"], dict):  # {search: S}: the search's chosen prompt
        out["prompt_search"] = afpaths.prompt_search(b["system_prompt"]["search"])
    return out


def prompt_search_flag(wc, input):
    return f"--prompt-search {input.prompt_search}" if "prompt_search" in input.keys() else ""


def template_file(wc):
    """The bundle's chat template file (relative to the workflow's root), or none for 'chatml'."""
    spec = CFG["bundles"][wc.bundle]["chat_template"]
    return [] if spec == "chatml" else [spec if Path(spec).is_absolute() else str(REPO / spec)]


def bundle_source(wc):
    b = CFG["bundles"][wc.bundle]
    return f"--nomination {afpaths.nomination(b['round'])}" if "round" in b else f"--arm {b['arm']}"


# ---- rules/report.smk ---------------------------------------------------------


def budget_targets(wc):
    """budget/table.json when the config has a budget (a target of `all`); under --report only
    once it is built (Snakemake refuses a report whose marked file does not exist)."""
    if BUDGET is None or (REPORTING["on"] and not os.path.exists("budget/table.html")):
        return []
    return ["budget/table.json"]


def budget_table_inputs(wc):
    """The table is written last: after every admitted arm's run and every round's nomination
    (so the readouts it counts are on disk)."""
    declared = [r for r in CFG["rounds"] if not afcontinual.is_template_round(CFG, r)]
    arms = {
        a
        for r in declared
        for m in [*CFG["rounds"][r]["candidates"], CFG["rounds"][r]["incumbent"]]
        if m in CFG["arms"]
        for a in BUDGET.gate_arms(m)
    }  # a continual round's arms run as its stop rules say, not for the table
    gone = afadmission.not_started(ADMISSION)
    ran = sorted(arms - gone)
    # the jobs those arms cause, which the budget reserved for them: measured in the table
    searches = [s for s, ps in CFG.get("prompt_search", {}).items() if ps["arm"] not in gone]
    return {
        "runs": [afpaths.run(a) for a in ran],
        "nominations": [afpaths.nomination(r) for r in declared],
        "searches": [afpaths.prompt_search(s) for s in searches],
        "guards": [afpaths.guard(g, a) for a in ran for g in BUDGET.guard_files(a).values()],
    }


REPORTING = {"on": False}  # set while `snakemake --report` writes the report


def _report_where_asked(create_report):
    """Snakemake writes the report (and reads --report-stylesheet) from the cwd, which `workdir:`
    moved to results/; a relative path means the directory snakemake was started in."""

    def create(*args, **kwargs):
        REPORTING["on"] = True
        settings = kwargs.get("report_settings")
        for attr in ("path", "stylesheet_path"):
            p = getattr(settings, attr, None)
            if p is not None and not Path(p).is_absolute():
                setattr(settings, attr, Path(workflow.workdir_init) / p)
        return create_report(*args, **kwargs)

    return create


def report_pages(wc):
    """Every declared round's page files and the continual rounds' trajectory; under --report
    only the pages that are built, because
    Snakemake refuses a report in which a file marked for it does not exist, and the main job
    (bundles/B3f) builds no page."""
    out = []
    # a continual round has its page only on request (reports/r4/...): `all` asking for it would
    # run the round whatever the stop rules say; rounds/{last}.png is their page
    for rnd in [r for r in CFG["rounds"] if not afcontinual.is_template_round(CFG, r)]:
        files = [expand(f, rnd=rnd)[0] for f in rules.round_report.output]
        if REPORTING["on"] and not all(os.path.exists(f) for f in files):
            logger.warning(
                f"report: round {rnd}'s page is not built yet, so it is left out; "
                f"`snakemake` (the default target) builds it"
            )
            continue
        out += files
    for rnd in afcontinual.template_rounds(CFG)[-1:]:  # the continual trajectory, once it ran
        if not REPORTING["on"] or os.path.exists(f"rounds/{rnd}.png"):
            out.append(f"rounds/{rnd}.png")
    return out


def round_report_inputs(wc):
    r = CFG["rounds"][wc.rnd]
    s = CFG["evals"][r["suite"]]
    arms = [a for a in [r["incumbent"], *r["candidates"]] if a != "base"]
    return {
        "nomination": afpaths.nomination(wc.rnd),
        "registration": afpaths.registration(wc.rnd),
        # every regime of the round's suite: the sweep greedy and as served, side by side
        "compare": [
            afpaths.compare(r["suite"], g, c, r["incumbent"])
            for g in s["regimes"]
            for c in r["candidates"]
        ],
        "noise": [
            afpaths.noise(r["suite"], g, a)
            for g, reg in s["regimes"].items()
            if reg["replicates"] >= 2
            for a in [r["incumbent"], *r["candidates"]]
        ],
        "runs": [afpaths.run(a) for a in arms],
    }


def report_arm(v):
    if v["kind"] == afschema.TRAINED:
        policy = CFG["corpora"][next(iter(v["mix"]))]["policy"]  # a mixture: its first source's
        return {"init": v["init"], "policy": policy, "lr": v["hyper"]["lr"]}
    if v["kind"] == afschema.NOMINEE:
        return {"init": v["init"], "nominee": v["round"], "parents": v["parents"]}
    dose = {"dose": v["dose"]} if "dose" in v else {}
    return {"init": v["init"], "weights": v["merge"]["weights"], **dose}


def report_arms(wc):
    return as_json({a: report_arm(v) for a, v in CFG["arms"].items()})
