# One report page (category) per round: `snakemake --report report.html` after a build.
report: "../workflow/report/workflow.rst"


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
