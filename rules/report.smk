# One report page (category) per round: `snakemake --report report.html` after a build.
report: "../workflow/report/workflow.rst"

import os

from snakemake.logging import logger

REPORTING = {"on": False}


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


workflow.create_report = _report_where_asked(workflow.create_report)


def report_pages(wc):
    """Every round's page files; under --report only the rounds whose pages are built, because
    Snakemake refuses a report in which a file marked for it does not exist, and the main job
    (bundles/B3f) builds no page."""
    out = []
    for rnd in CFG["rounds"]:
        files = [expand(f, rnd=rnd)[0] for f in rules.round_report.output]
        if REPORTING["on"] and not all(os.path.exists(f) for f in files):
            logger.warning(f"report: round {rnd}'s page is not built yet, so it is left out; "
                           f"`snakemake` (the default target) builds it")
            continue
        out += files
    return out


def round_report_inputs(wc):
    r = CFG["rounds"][wc.rnd]
    s = CFG["evals"][r["suite"]]
    arms = [a for a in [r["incumbent"], *r["candidates"]] if a != "base"]
    return {
        "nomination": f"nominations/{wc.rnd}.json",
        "registration": f"nominations/{wc.rnd}.bar.json",
        # every regime of the round's suite: the sweep greedy and as served, side by side
        "compare": [f"compare/{r['suite']}/{g}/{c}__{r['incumbent']}.json"
                    for g in s["regimes"] for c in r["candidates"]],
        "noise": [f"noise/{r['suite']}/{g}/{a}.json" for g, reg in s["regimes"].items()
                  if reg["replicates"] >= 2 for a in [r["incumbent"], *r["candidates"]]],
        "runs": [f"runs/{a}/final" for a in arms],
    }


def report_arms(wc):
    return as_json({a: {"init": v["init"], "policy": CFG["corpora"][v["corpus"]]["policy"],
                        "lr": v["hyper"]["lr"]} for a, v in CFG["arms"].items()})


rule round_report:
    input:
        unpack(round_report_inputs),
    output:
        dose=report("reports/{rnd}/dose_response.png", caption="../workflow/report/dose_response.rst",
                    category="Round {rnd}", subcategory="1. sweep"),
        wl=report("reports/{rnd}/wins_losses.png", caption="../workflow/report/wins_losses.rst",
                  category="Round {rnd}", subcategory="1. sweep"),
        noise=report("reports/{rnd}/noise_floor.png", caption="../workflow/report/noise_floor.rst",
                     category="Round {rnd}", subcategory="2. noise floor"),
        loss=report("reports/{rnd}/loss_curves.png", caption="../workflow/report/loss_curves.rst",
                    category="Round {rnd}", subcategory="3. training"),
        table=report("reports/{rnd}/nomination.html", caption="../workflow/report/nomination.rst",
                     category="Round {rnd}", subcategory="0. nomination"),
        lineage=report("reports/{rnd}/lineage.png", caption="../workflow/report/lineage.rst",
                       category="Round {rnd}", subcategory="0. nomination"),
    params:
        cfg=lambda wc: as_json(CFG["rounds"][wc.rnd]),
        arms=report_arms,
    log:
        "logs/reports/{rnd}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.roundreport --round {wildcards.rnd} --round-json {params.cfg:q} "
        "--arms-json {params.arms:q} --nomination {input.nomination} "
        "--registration {input.registration} --compare {input.compare} --noise {input.noise} "
        "--runs {input.runs} --out-dir reports/{wildcards.rnd} > {log} 2>&1"
