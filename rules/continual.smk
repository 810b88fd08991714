# Continual rounds (arenaflow.rounds.continual; config `continual:` and {nominee: <round>} references).
# A round's nominee as an arm: runs/{round}-nominee/final holds the weights the round's sealed
# nomination promotes (its incumbent when none cleared). Whatever names the nominee waits on the
# nomination, and `snakemake -n` shows it waiting.
rule nominee_run:
    input:
        nomination=lambda wc: afpaths.nomination(arm(wc)["round"]),
        runs=lambda wc: [afpaths.run(a) for a in arm(wc)["parents"]],
    output:
        update(directory(afpaths.RUN)),
    log:
        "logs/nominees/{arm}.log",
    wildcard_constraints:
        arm=ids(NOMINEE_IDS),
    localrule: True
    conda:
        "../envs/arenaflow.yaml"
    params:
        rnd=lambda wc: arm(wc)["round"],
    shell:
        "python -m arenaflow.rounds.continual nominee --round {params.rnd} --nomination {input.nomination} "
        "--runs runs --out {output} > {log} 2>&1"


# The unattended target: `snakemake rounds/r5.json` runs the template's rounds up to r5, one
# after another, and stops early by the template's stop rules (rules/common.smk continual_walk);
# the JSON says which rounds ran and why the rest did not, the PNG plots the trajectory.
rule round_status:
    input:
        lambda wc: continual_walk(wc)["nominations"],
    output:
        json=afpaths.ROUND_STATUS,
        plot=report(
            afpaths.ROUND_PLOT,
            caption="../workflow/report/continual.rst",
            category="Continual rounds",
        ),
    log:
        "logs/rounds/{rnd}.log",
    localrule: True
    conda:
        "../envs/arenaflow.yaml"
    params:
        rounds=lambda wc: as_json(afcontinual.template_rounds(CFG) or [wc.rnd]),
        stop=as_json(CFG.get("continual", {}).get("stop", {})),
        note=lambda wc: continual_walk(wc)["note"],
    shell:
        "python -m arenaflow.rounds.continual status --round {wildcards.rnd} --rounds-json {params.rounds:q} "
        "--stop-json {params.stop:q} --budget-note={params.note:q} --nominations {input} "
        "--out {output.json} --plot {output.plot} > {log} 2>&1"
