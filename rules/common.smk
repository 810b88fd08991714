# Config validation and lineage resolution happen here, before any job runs; a bad config
# stops `snakemake -n` with one message naming the file and key (arenaflow.config).
import json
from pathlib import Path

from arenaflow import config as afconfig

REPO = Path(workflow.basedir)
try:
    CFG = afconfig.resolve(
        config,
        repo_root=REPO,
        schema_dir=REPO / "workflow" / "schemas",
        config_file=" + ".join(map(str, workflow.overwrite_configfiles or ["config/config.yaml"])),
        sources=[REPO / "config" / "config.yaml", *workflow.overwrite_configfiles],
    )
except afconfig.ConfigError as e:
    raise WorkflowError(f"arenaflow config error: {e}") from None

# Absolute, or the Slurm executor resolves paths against results/ twice
# (docs/notes.md#workdir-is-absolute).
workdir: str(REPO / CFG["results_dir"])


BASE = CFG["base"]["path"]
BASE_FILES = sorted(str(p) for p in Path(BASE).iterdir() if p.is_file())
ARM_IDS = sorted(CFG["arms"])
READOUT_ARMS = ["base", *ARM_IDS]


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
    rarm=ids(READOUT_ARMS),
    ref=ids(READOUT_ARMS),
    regime="[A-Za-z0-9][A-Za-z0-9_-]*",
    rep="[0-9]+",


def as_json(section):
    return afconfig.stage_json(section)


def run_dir(arm):
    """runs/{arm}/final, or nothing for 'base' (which has no adapter)."""
    return [] if arm == "base" else [f"runs/{arm}/final"]


def adapter_flag(paths):
    return f"--adapter {paths[0]}" if paths else ""


def readouts(suite, arm, regime):
    reps = range(CFG["evals"][suite]["regimes"][regime]["replicates"])  # per regime (config.py)
    return [f"readouts/{suite}/{arm}/{regime}.r{r}.parquet" for r in reps]


def lineage_comparisons(arm):
    """compare files of `arm` and each of its ancestors against its own init, every suite/regime."""
    out = []
    for a in [arm, *CFG["arms"][arm]["lineage"]]:
        init = CFG["arms"][a]["init"]
        for suite, s in CFG["evals"].items():
            out += [f"compare/{suite}/{regime}/{a}__{init}.json" for regime in s["regimes"]]
    return out


# The GPU-minute budget (config `budget:`, arenaflow.budget). The train rule's input function
# calls budget_gate for every arm the DAG holds, while the DAG is built: the pending arms seen so
# far are costed together, and a run that would overrun the budget is refused there, naming the
# arm, its estimate and the budget left, before any job is submitted. Not re-checked inside a
# submitted job (the decision was made before sbatch), nor by --touch or --report (no executor).
from arenaflow import budget as afbudget

BUDGET = afbudget.Budget(CFG, results=REPO / CFG["results_dir"]) if "budget" in CFG else None
BUDGET_ARMS = set()


def budget_gate(wc):
    if (BUDGET is None or not workflow.is_main_process or workflow.executor_plugin is None
            or workflow.touch or wc.arm in BUDGET_ARMS):
        return []
    BUDGET_ARMS.add(wc.arm)
    BUDGET.refresh()  # a DAG update after a checkpoint sees what has run since
    try:
        BUDGET.check(BUDGET_ARMS, wc.arm)
    except afbudget.BudgetError as e:
        raise WorkflowError(str(e)) from None
    return []
