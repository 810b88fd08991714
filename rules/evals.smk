def suite(wc):
    return CFG["evals"][wc.suite]


rule readout:
    input:
        pool=lambda wc: f"pools/{suite(wc)['pool']}.jsonl",
        adapter=lambda wc: run_dir(wc.rarm),
        base=BASE_FILES,
    output:
        "readouts/{suite}/{rarm}/{regime}.r{rep}.parquet",
    params:
        regime=lambda wc: as_json(suite(wc)["regimes"][wc.regime]),
        adapter=lambda wc, input: adapter_flag(input.adapter),
        seed=lambda wc: suite(wc)["seed"],
        batch=lambda wc: suite(wc)["batch_size"],
        system=CFG["system_prompt"],
        base=BASE,
    log:
        "logs/readouts/{suite}/{rarm}/{regime}.r{rep}.log",
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.evals readout --suite {wildcards.suite} --arm {wildcards.rarm} "
        "--pool {input.pool} --base-model {params.base:q} {params.adapter} "
        "--regime-json {params.regime:q} --replicate {wildcards.rep} --seed {params.seed} "
        "--batch-size {params.batch} --system-prompt {params.system:q} --out {output} > {log} 2>&1"


rule compare:
    input:
        cand=lambda wc: readouts(wc.suite, wc.rarm, wc.regime),
        ref=lambda wc: readouts(wc.suite, wc.ref, wc.regime),
    output:
        "compare/{suite}/{regime}/{rarm}__{ref}.json",
    log:
        "logs/compare/{suite}/{regime}/{rarm}__{ref}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.evals compare --cand {input.cand} --ref {input.ref} "
        "--out {output} > {log} 2>&1"
