# Config validation and lineage resolution happen here, before any job runs; a bad config
# stops `snakemake -n` with one message naming the file and key (arenaflow.config). The rules'
# input and param functions are one-line wirings of arenaflow.dag (what each job reads and is
# passed, computed from the resolved config); what needs Snakemake itself (checkpoints, the
# main process's admission, the report) stays here.
#
# Every data output is flagged update(): Snakemake then keeps a job's previous output (a copy
# under .snakemake/) instead of deleting it before the job, and restores it if the job fails,
# so a failed rerun (a full disk, a refused input, a crash) never loses the good output it would
# have replaced. The writers replace an output atomically (arenaflow.io), so finding the old one
# in place at the start changes nothing else.
import os
from pathlib import Path

from snakemake.logging import logger

from arenaflow import config as afconfig
from arenaflow import paths as afpaths
from arenaflow import schema as afschema
from arenaflow import zygote as afzygote
from arenaflow.budget import admission as afadmission
from arenaflow.budget import ledger as afbudget
from arenaflow.dag import rounds as afrounds
from arenaflow.dag import stages as afdag
from arenaflow.rounds import continual as afcontinual
from arenaflow.rounds import nominate as afnominate

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
# A built pool with no rows passes for up to date: refused here, not by a readout at the end.
try:
    afdag.refuse_empty_pools(CFG, REPO / CFG["results_dir"])
except ValueError as e:
    raise WorkflowError(f"arenaflow: {e}") from None
# as resolved, before admission drops refused candidates (the budget table's job reads it);
# without the trackers, which change no output
CFG_JSON = afschema.stage_json({k: v for k, v in CFG.items() if k != "tracking"})
# The trackers' settings (arenaflow.tracking), a param of the jobs that report to them that
# Snakemake does not track (afdag.Untracked): changing them reruns nothing.
TRACKING = afdag.tracking_flag(CFG)
# With config `fork_server`, every rule's command runs through the fork server's client
# (arenaflow.zygote). Not a param: it changes no output, so setting it reruns nothing.
if CFG.get("fork_server"):
    shell.prefix(f"set -euo pipefail; {afzygote.command(CFG['fork_server'])}")


# Jobs inherit these (local runs, and sbatch's default --export=ALL): a lineage's sampling,
# readout and training jobs compile each graph once. A cache set in the environment wins.
for _var, _dir in afpaths.COMPILE_CACHE.items():
    os.environ.setdefault(_var, str(REPO / CFG["results_dir"] / _dir))


# Absolute, or the Slurm executor resolves paths against results/ twice
# (docs/notes.md#workdir-is-absolute).
workdir: str(REPO / CFG["results_dir"])


BASE = CFG["base"]["path"]
BASE_FILES = sorted(str(p) for p in Path(BASE).iterdir() if p.is_file())
# base.chat_template as every rendering job takes it (own, chatml, or the .jinja file's path)
CHAT_TEMPLATE = CFG["base"]["chat_template"]
# ... and its .jinja file, an input of each of those jobs so that editing it reruns what it
# renders ([] for own, whose template is among BASE_FILES, and for chatml)
CHAT_TEMPLATE_FILE = afdag.chat_template_file(CFG)
ARM_IDS = sorted(CFG["arms"])
TRAINED_IDS = sorted(a for a, v in CFG["arms"].items() if v["kind"] == afschema.TRAINED)
MERGED_IDS = sorted(
    a for a, v in CFG["arms"].items() if v["kind"] in (afschema.MERGE, afschema.DOSE)
)
NOMINEE_IDS = sorted(a for a, v in CFG["arms"].items() if v["kind"] == afschema.NOMINEE)
READOUT_ARMS = ["base", *ARM_IDS]
# a prompt search's regimes (R-<prompt>, R-none): read by rule readout_search, one job each
SEARCH_REGIMES = sorted({g for s in CFG["evals"].values() for g in s.get("prompt_regimes", {})})
# What a one-GPU job asks of the scheduler: Slurm GRES, and `local_gpus`, which local runs cap
# (profiles/gpu-local; not `gpu`, which the Slurm plugin turns into --gpus beside the GRES).
GPU_JOB = dict(mem_mb=8000, runtime=60, gres="gpu:1", local_gpus=1)
ids = afdag.one_of
as_json = afschema.stage_json


def base_dir(wc, input):
    """The base model's directory, from the rule's `base` input (a path param would hide it)."""
    return str(Path(input.base[0]).parent)


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
    shard="[0-9]+-of-[0-9]+",


def arm(wc):
    return CFG["arms"][wc.arm]


def hyper(wc):
    """A trained arm's hyperparameters, whole as resolved (the schema's defaults filled)."""
    return arm(wc)["hyper"]


def suite(wc):
    return CFG["evals"][wc.suite]


def judged(wc):
    return CFG["judged"][wc.read]


def readouts(suite_id, arm_id, regime):
    return afdag.readouts(CFG, suite_id, arm_id, regime)


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
BUDGET = afbudget.Budget(CFG, results=REPO / CFG["results_dir"]) if "budget" in CFG else None

# Admission arm by arm, as Slurm's GrpTRESMins (arenaflow.budget.admission): before the DAG is built,
# pending arms are admitted in priority order while they fit under the cap; a refused one (and
# any that requires it) is dropped from its rounds' candidates, the rest of the lineage runs, and
# budget/table.json records the refusal. The main process decides from the results on disk when
# it starts and passes the arms it did not admit to its jobs (a registered envvar): a job process
# (Slurm) re-parses this file later, when a finished arm's measured cost may let a refused one
# fit, and would otherwise judge a round on other candidates than the main process planned.
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


def over_budget(rnd):
    return afrounds.over_budget(CFG, BUDGET, rnd)


def nomination_of(rnd):
    """A round's nomination once its checkpoint ran, read only if sealed (a hand edit stops the
    DAG here): (path, nomination)."""
    path = checkpoints.nominate.get(rnd=rnd).output[0]
    try:
        return path, afnominate.load_sealed(path)
    except afnominate.SealError as e:
        raise WorkflowError(f"arenaflow: round {rnd}: {e}") from None


def continual_walk(wc):
    return afrounds.continual_walk(CFG, wc.rnd, nomination_of, over_budget)


def bundle_arm(wc):
    """The bundle's arm; for a round, the one its sealed nomination promotes. Whether the files
    it judged are unchanged is checked when the bundle is built: a readout that is gone or
    remade here reruns the nomination first."""
    b = CFG["bundles"][wc.bundle]
    return b["arm"] if "arm" in b else nomination_of(b["round"])[1]["promoted"]


def budget_targets(wc):
    """budget/table.json when the config has a budget (a target of `all`); under --report only
    once it is built (Snakemake refuses a report whose marked file does not exist)."""
    if BUDGET is None or (REPORTING["on"] and not os.path.exists(afpaths.budget_table("html"))):
        return []
    return [afpaths.budget_table("json")]


def budget_table_inputs(wc):
    return afrounds.budget_table_inputs(CFG, BUDGET, afadmission.not_started(ADMISSION))


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
    for rnd in afrounds.declared_rounds(CFG):
        files = [expand(f, rnd=rnd)[0] for f in rules.round_report.output]
        if REPORTING["on"] and not all(os.path.exists(f) for f in files):
            logger.warning(
                f"report: round {rnd}'s page is not built yet, so it is left out; "
                f"`snakemake` (the default target) builds it"
            )
            continue
        out += files
    for rnd in afcontinual.template_rounds(CFG)[-1:]:  # the continual trajectory, once it ran
        if not REPORTING["on"] or os.path.exists(afpaths.round_plot(rnd)):
            out.append(afpaths.round_plot(rnd))
    return out
