# One report page (category) per round: `snakemake --report report.html` after a build.
report: "../workflow/report/workflow.rst"


workflow.create_report = _report_where_asked(workflow.create_report)


rule round_report:
    input:
        unpack(lambda wc: afrounds.round_report_inputs(CFG, wc.rnd)),
    output:
        dose=report(
            afpaths.report_page("dose_response.png"),
            caption="../workflow/report/dose_response.rst",
            category="Round {rnd}",
            subcategory="1. sweep",
        ),
        merges=report(
            afpaths.report_page("merges.png"),
            caption="../workflow/report/merges.rst",
            category="Round {rnd}",
            subcategory="1. sweep",
        ),
        wl=report(
            afpaths.report_page("wins_losses.png"),
            caption="../workflow/report/wins_losses.rst",
            category="Round {rnd}",
            subcategory="1. sweep",
        ),
        noise=report(
            afpaths.report_page("noise_floor.png"),
            caption="../workflow/report/noise_floor.rst",
            category="Round {rnd}",
            subcategory="2. noise floor",
        ),
        loss=report(
            afpaths.report_page("loss_curves.png"),
            caption="../workflow/report/loss_curves.rst",
            category="Round {rnd}",
            subcategory="3. training",
        ),
        table=report(
            afpaths.report_page("nomination.html"),
            caption="../workflow/report/nomination.rst",
            category="Round {rnd}",
            subcategory="0. nomination",
        ),
        lineage=report(
            afpaths.report_page("lineage.png"),
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
        arms=afrounds.report_arms(CFG),
        out=lambda wc: afpaths.report_dir(wc.rnd),
    shell:
        "python -m arenaflow.rounds.report --round {wildcards.rnd} --round-json {params.cfg:q} "
        "--arms-json {params.arms:q} --nomination {input.nomination} "
        "--registration {input.registration} --compare {input.compare} --noise {input.noise} "
        "--runs {input.runs} --out-dir {params.out} > {log} 2>&1"


# The GPU-minute cap, what each arm cost and what was refused (arenaflow.budget.admission); with a
# `budget:` only, after everything else the lineage runs.
rule budget_table:
    input:
        unpack(budget_table_inputs),
    output:
        json=afpaths.budget_table("json"),
        md=afpaths.budget_table("md"),
        html=report(
            afpaths.budget_table("html"),
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
        "python -m arenaflow.budget.admission --config-json {params.cfg:q} --results . "
        "--decisions-json {params.decisions:q} "
        "--out {output.json} --md {output.md} --html {output.html} > {log} 2>&1"
