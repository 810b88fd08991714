from arenaflow import bar as afbar


def replicates_of(suite, regime):
    return CFG["evals"][suite]["regimes"][regime]["replicates"]


def round_needs(wc):
    """compare and noise JSONs the round's bar reads, and the candidate readouts it judges."""
    return afbar.requirements(CFG["rounds"][wc.rnd], replicates_of)


# The bar, its sha256 and a UTC time, from the round's config alone (no inputs), so it is
# written before the readouts it judges: priority puts it first among the jobs ready at start.
# A config edit re-registers it, and `nominate` then refuses readouts made before that.
rule register_bar:
    output:
        "nominations/{rnd}.bar.json",
    params:
        cfg=lambda wc: as_json(CFG["rounds"][wc.rnd]),
    priority: 100
    localrule: True
    log:
        "logs/nominations/{rnd}.bar.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.nominate register --round {wildcards.rnd} --round-json {params.cfg:q} "
        "--out {output} > {log} 2>&1"


# A checkpoint: which arm a bundle serves is known only once the round has been judged.
checkpoint nominate:
    input:
        registration="nominations/{rnd}.bar.json",
        compare=lambda wc: round_needs(wc)["compare"],
        noise=lambda wc: round_needs(wc)["noise"],
        readouts=lambda wc: round_needs(wc)["readouts"],
    output:
        "nominations/{rnd}.json",
    params:
        cfg=lambda wc: as_json(CFG["rounds"][wc.rnd]),
    log:
        "logs/nominations/{rnd}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.nominate judge --round {wildcards.rnd} --round-json {params.cfg:q} "
        "--registration {input.registration} --compare {input.compare} --noise {input.noise} "
        "--readouts {input.readouts} --out {output} > {log} 2>&1"
