rule sample_candidates:
    input:
        pool=corpus_pool,
        policy=lambda wc: run_dir(CFG["corpora"][wc.corpus]["policy"]),
        base=BASE_FILES,
    output:
        "candidates/{corpus}/samples.jsonl",
    log:
        "logs/candidates/{corpus}.sample.log",
    conda:
        "../envs/arenaflow.yaml"
    resources:
        mem_mb=8000,
        runtime=60,
        gres="gpu:1",  # Slurm GRES; ignored by local runs
        local_gpus=1,  # what local runs cap (profiles/gpu-local); ignored by the Slurm plugin
    params:
        cfg=lambda wc: afschema.sampling_params(CFG["corpora"][wc.corpus]),
        adapter=lambda wc, input: adapter_flag(input.policy),
        system=CFG["system_prompt"],
        base=base_dir,
    shell:
        "{ZYGOTE}python -m arenaflow.candidates sample --pool {input.pool} --base-model {params.base:q} "
        "{params.adapter} --system-prompt={params.system:q} --params-json {params.cfg:q} "
        "--out {output} > {log} 2>&1"


rule verify_candidates:
    input:
        pool=corpus_pool,
        samples="candidates/{corpus}/samples.jsonl",
    output:
        "candidates/{corpus}/verdicts.jsonl",
    log:
        "logs/candidates/{corpus}.verify.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        marker=scaffold_marker,
    shell:
        "{ZYGOTE}python -m arenaflow.candidates verify --pool {input.pool} --samples {input.samples} "
        "--marker={params.marker:q} --out {output} > {log} 2>&1"
