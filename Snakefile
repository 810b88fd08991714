# arenaflow: pools -> candidates -> corpora -> runs -> readouts -> compare -> nominations -> bundles.
#   snakemake --cores 2 bundles/B3f          # local, on the embedded default
#   snakemake --profile profiles/slurm bundles/B3f
# Wiring only: the logic lives in src/arenaflow, one module per stage.
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


from arenaflow import config as afconfig
from arenaflow import schema as afschema

# Every --configfile is merged over config/config.yaml, unless the files name another file as
# `merge_over`, or null: a standalone lineage config (config/seeds/*.yaml). `config` holds the
# --configfile and --config values here already.
MERGED_OVER = afconfig.merged_over(config)
UNDER = Path(workflow.basedir) / MERGED_OVER if MERGED_OVER is not None else None

# Snakemake's own loader names no line ("not valid JSON or YAML"): read it first, to name one.
# (Files given with --configfile are read by Snakemake before this file is; `python -m
# arenaflow.config FILE` names the line of an error in one of them.)
if UNDER is not None:
    try:
        afschema.load_yaml(UNDER)
    except afconfig.ConfigError as e:
        raise WorkflowError(f"arenaflow config error: {e}") from None

    # Absolute: `workdir:` moves the cwd to results/, and --report re-reads config files there.
    configfile: str(UNDER)


include: "rules/common.smk"
include: "rules/pools.smk"
include: "rules/candidates.smk"
include: "rules/corpora.smk"
include: "rules/train.smk"
include: "rules/merge.smk"
include: "rules/evals.smk"
include: "rules/judged.smk"
include: "rules/nominate.smk"
include: "rules/continual.smk"
include: "rules/bundles.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        expand("bundles/{bundle}", bundle=CFG["bundles"]),
        report_pages,  # the pages of --report (rules/report.smk)
        budget_targets,  # with a budget: the cap, each arm's cost, the refusals
