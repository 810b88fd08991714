# One job per suite and arm: a process loads the model once and reads every regime x
# replicate of the suite (one parquet each, as compare, noise and the judged reads take them).
# A rule per suite, readout_<suite>, because suites differ in their regimes and replicates.
for _suite in CFG["evals"]:

    rule:
        name:
            f"readout_{_suite}"
        input:
            pool=afpaths.pool(CFG["evals"][_suite]["pool"]),
            adapter=lambda wc: run_dir(wc.rarm),
            base=BASE_FILES,
        output:
            suite_readouts(_suite),
        log:
            f"logs/readouts/{_suite}/{{rarm}}.log",
        conda:
            "../envs/arenaflow.yaml"
        resources:
            mem_mb=8000,
            runtime=60,
            gres="gpu:1",  # Slurm GRES; ignored by local runs
            local_gpus=1,  # what local runs cap (profiles/gpu-local); ignored by the Slurm plugin
        params:
            suite=_suite,
            plan=lambda wc, output, s=_suite: readout_plan(s, output),
            adapter=lambda wc, input: adapter_flag(input.adapter),
            seed=CFG["evals"][_suite]["seed"],
            batch=CFG["evals"][_suite]["batch_size"],
            engine=CFG["evals"][_suite]["engine"],
            system=CFG["system_prompt"],
            base=base_dir,
        shell:
            "python -m arenaflow.evals readout --suite {params.suite} --arm {wildcards.rarm} "
            "--pool {input.pool} --base-model {params.base:q} {params.adapter} "
            "--plan {params.plan:q} --seed {params.seed} --batch-size {params.batch} "
            "--engine {params.engine} --system-prompt {params.system:q} > {log} 2>&1"


# Pools every replicate of the regime; reports each replicate and the paired t over replicates.
rule compare:
    input:
        cand=lambda wc: readouts(wc.suite, wc.rarm, wc.regime),
        ref=lambda wc: readouts(wc.suite, wc.ref, wc.regime),
    output:
        afpaths.COMPARE,
    log:
        "logs/compare/{suite}/{regime}/{rarm}__{ref}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.evals compare --suite {wildcards.suite} --regime {wildcards.regime} "
        "--cand {input.cand} --ref {input.ref} --out {output} > {log} 2>&1"


# An arm against itself across its K >= 2 replicates: what a real effect has to exceed.
rule noise:
    input:
        lambda wc: readouts(wc.suite, wc.rarm, wc.regime),
    output:
        afpaths.NOISE,
    log:
        "logs/noise/{suite}/{regime}/{rarm}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.evals noise --suite {wildcards.suite} --regime {wildcards.regime} "
        "--readouts {input} --out {output} > {log} 2>&1"
