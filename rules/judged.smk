# Blinded judged reads (arenaflow.evals.judged): the judge's packet and its key, written apart, and the
# unblinded comparison once config names the judge's CSV. Light work: both run in the main process.


rule judged_pack:
    input:
        pool=lambda wc: afpaths.pool(CFG["evals"][judged(wc)["suite"]]["pool"]),
        a=lambda wc: afdag.judged_readout(CFG, wc.read, "a"),
        b=lambda wc: afdag.judged_readout(CFG, wc.read, "b"),
    output:
        pairs=update(afpaths.JUDGED_PAIRS),
        key=update(afpaths.JUDGED_KEY),
    log:
        "logs/judged/{read}.pack.log",
    localrule: True
    conda:
        "../envs/arenaflow.yaml"
    params:
        n=lambda wc: judged(wc)["n"],
        seed=lambda wc: judged(wc)["seed"],
        out=lambda wc: afpaths.judged_dir(wc.read),
    shell:
        "python -m arenaflow.evals.judged pack --pool {input.pool} --a {input.a} --b {input.b} "
        "--n {params.n} --seed {params.seed} --out {params.out} --key {output.key} > {log} 2>&1"


rule judged_score:
    input:
        pairs=afpaths.JUDGED_PAIRS,
        key=afpaths.JUDGED_KEY,
        scores=lambda wc: afdag.judged_scores(CFG, wc.read),
    output:
        update(afpaths.JUDGED),
    log:
        "logs/judged/{read}.score.log",
    localrule: True
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.evals.judged score --pairs {input.pairs} --key {input.key} "
        "--scores {input.scores:q} --out {output} > {log} 2>&1"
