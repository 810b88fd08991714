# One report page (category) per round: `snakemake --report report.html` after a build.
report: "../workflow/report/workflow.rst"


workflow.create_report = _report_where_asked(workflow.create_report)


rule round_report:
    input:
        unpack(round_report_inputs),
    output:
        dose=report(
            "reports/{rnd}/dose_response.png",
            caption="../workflow/report/dose_response.rst",
            category="Round {rnd}",
            subcategory="1. sweep",
        ),
        merges=report(
            "reports/{rnd}/merges.png",
            caption="../workflow/report/merges.rst",
            category="Round {rnd}",
            subcategory="1. sweep",
        ),
        wl=report(
            "reports/{rnd}/wins_losses.png",
            caption="../workflow/report/wins_losses.rst",
            category="Round {rnd}",
            subcategory="1. sweep",
        ),
        noise=report(
            "reports/{rnd}/noise_floor.png",
            caption="../workflow/report/noise_floor.rst",
            category="Round {rnd}",
            subcategory="2. noise floor",
        ),
        loss=report(
            "reports/{rnd}/loss_curves.png",
            caption="../workflow/report/loss_curves.rst",
            category="Round {rnd}",
            subcategory="3. training",
        ),
        table=report(
            "reports/{rnd}/nomination.html",
            caption="../workflow/report/nomination.rst",
            category="Round {rnd}",
            subcategory="0. nomination",
        ),
        lineage=report(
            "reports/{rnd}/lineage.png",
            caption="../workflow/report/lineage.rst",
            category="Round {rnd}",
            subcategory="0. nomination",
        ),
    log:
        "logs/reports/{rnd}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=lambda wc: as_json(CFG["rounds"][wc.rnd]),
        arms=report_arms,
    shell:
        "{ZYGOTE}python -m arenaflow.rounds.report --round {wildcards.rnd} --round-json {params.cfg:q} "
        "--arms-json {params.arms:q} --nomination {input.nomination} "
        "--registration {input.registration} --compare {input.compare} --noise {input.noise} "
        "--runs {input.runs} --out-dir reports/{wildcards.rnd} > {log} 2>&1"


# The GPU-minute cap, what each arm cost and what was refused (arenaflow.budget.admission); with a
# `budget:` only, after everything else the lineage runs.
rule budget_table:
    input:
        unpack(budget_table_inputs),
    output:
        json="budget/table.json",
        md="budget/table.md",
        html=report(
            "budget/table.html",
            caption="../workflow/report/budget.rst",
            category="GPU-minute budget",
        ),
    log:
        "logs/budget_table.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=CFG_JSON,
        decisions=as_json(ADMISSION),  # this run's, made by the main process as it started
    shell:
        "{ZYGOTE}python -m arenaflow.budget.admission --config-json {params.cfg:q} --results . "
        "--decisions-json {params.decisions:q} "
        "--out {output.json} --md {output.md} --html {output.html} > {log} 2>&1"
