# Blinded judged reads (arenaflow.evals.judged): the judge's packet and its key, written apart, and the
# unblinded comparison once config names the judge's CSV. Light work: both run in the main process.


rule judged_pack:
    input:
        pool=lambda wc: afpaths.pool(CFG["evals"][judged(wc)["suite"]]["pool"]),
        a=lambda wc: judged_readout(wc, "a"),
        b=lambda wc: judged_readout(wc, "b"),
    output:
        pairs="judged/{read}/pairs.jsonl",
        key="judged/{read}.key.json",
    log:
        "logs/judged/{read}.pack.log",
    localrule: True
    conda:
        "../envs/arenaflow.yaml"
    params:
        n=lambda wc: judged(wc)["n"],
        seed=lambda wc: judged(wc)["seed"],
    shell:
        "{ZYGOTE}python -m arenaflow.evals.judged pack --pool {input.pool} --a {input.a} --b {input.b} "
        "--n {params.n} --seed {params.seed} --out judged/{wildcards.read} --key {output.key} > {log} 2>&1"


rule judged_score:
    input:
        pairs="judged/{read}/pairs.jsonl",
        key="judged/{read}.key.json",
        scores=judged_scores,
    output:
        "judged/{read}.json",
    log:
        "logs/judged/{read}.score.log",
    localrule: True
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "{ZYGOTE}python -m arenaflow.evals.judged score --pairs {input.pairs} --key {input.key} "
        "--scores {input.scores:q} --out {output} > {log} 2>&1"
