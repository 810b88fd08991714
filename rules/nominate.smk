def round_comparisons(wc):
    r = CFG["rounds"][wc.rnd]
    return [
        f"compare/{r['suite']}/{r['regime']}/{c}__{r['incumbent']}.json" for c in r["candidates"]
    ]


# A checkpoint: which arm a bundle serves is known only once the round has been judged.
checkpoint nominate:
    input:
        round_comparisons,
    output:
        "nominations/{rnd}.json",
    params:
        cfg=lambda wc: as_json(CFG["rounds"][wc.rnd]),
    log:
        "logs/nominations/{rnd}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.nominate --round {wildcards.rnd} --round-json {params.cfg:q} "
        "--compare {input} --out {output} > {log} 2>&1"
