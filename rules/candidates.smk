# A corpus with `shards: 1` (the default) samples in one job; with N > 1, in N shard jobs (one
# GPU each, contiguous runs of whole batches: arenaflow.shards) and a CPU merge of their parts
# into the same samples file, byte for byte. A lost shard reruns alone.
rule sample_candidates:
    input:
        pool=lambda wc: afdag.corpus_pool(CFG, wc.corpus),
        policy=lambda wc: afdag.run_dirs(CFG["corpora"][wc.corpus]["policy"]),
        base=BASE_FILES,
        chat=CHAT_TEMPLATE_FILE,
    output:
        rows=update(afpaths.SAMPLES),
        manifest=update(afpaths.SAMPLES_MANIFEST),
    log:
        "logs/candidates/{corpus}.sample.log",
    wildcard_constraints:
        corpus=ids(afdag.sharded(CFG["corpora"], many=False)),
    conda:
        "../envs/arenaflow.yaml"
    resources:
        **GPU_JOB,
    params:
        tracking=TRACKING,
        cfg=lambda wc: afschema.sampling_params(CFG["corpora"][wc.corpus]),
        adapter=lambda wc, input: afdag.adapter_flag(input.policy),
        system=CFG["system_prompt"],
        base=base_dir,
        chat=CHAT_TEMPLATE,
    shell:
        "python -m arenaflow.candidates sample --pool {input.pool} --base-model {params.base:q} "
        "--chat-template {params.chat:q} "
        "{params.adapter} --system-prompt={params.system:q} --params-json {params.cfg:q} "
        "--out {output.rows} {params.tracking} > {log} 2>&1"


rule sample_candidates_shard:
    input:
        pool=lambda wc: afdag.corpus_pool(CFG, wc.corpus),
        policy=lambda wc: afdag.run_dirs(CFG["corpora"][wc.corpus]["policy"]),
        base=BASE_FILES,
        chat=CHAT_TEMPLATE_FILE,
    output:
        rows=update(afpaths.SAMPLES_SHARD),
        manifest=update(afpaths.SAMPLES_SHARD_MANIFEST),
    log:
        "logs/candidates/{corpus}.sample.{shard}.log",
    wildcard_constraints:
        corpus=ids(afdag.sharded(CFG["corpora"])),
    conda:
        "../envs/arenaflow.yaml"
    resources:
        **GPU_JOB,
    params:
        tracking=TRACKING,
        cfg=lambda wc: afschema.sampling_params(CFG["corpora"][wc.corpus]),
        adapter=lambda wc, input: afdag.adapter_flag(input.policy),
        system=CFG["system_prompt"],
        base=base_dir,
        chat=CHAT_TEMPLATE,
    shell:
        "python -m arenaflow.candidates sample --pool {input.pool} --base-model {params.base:q} "
        "--chat-template {params.chat:q} "
        "{params.adapter} --system-prompt={params.system:q} --params-json {params.cfg:q} "
        "--shard {wildcards.shard} --out {output.rows} {params.tracking} > {log} 2>&1"


rule merge_samples:
    input:
        lambda wc: afdag.sample_shards(CFG, wc.corpus),
    output:
        rows=update(afpaths.SAMPLES),
        manifest=update(afpaths.SAMPLES_MANIFEST),
    log:
        "logs/candidates/{corpus}.merge.log",
    wildcard_constraints:
        corpus=ids(afdag.sharded(CFG["corpora"])),
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.candidates merge --parts {input} --out {output.rows} > {log} 2>&1"


rule verify_candidates:
    input:
        pool=lambda wc: afdag.corpus_pool(CFG, wc.corpus),
        samples=afpaths.SAMPLES,
    output:
        rows=update(afpaths.VERDICTS),
        manifest=update(afpaths.VERDICTS_MANIFEST),
    log:
        "logs/candidates/{corpus}.verify.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        tracking=TRACKING,
        marker=lambda wc: afdag.scaffold_marker(CFG, wc.corpus),
    shell:
        "python -m arenaflow.candidates verify --pool {input.pool} --samples {input.samples} "
        "--marker={params.marker:q} --out {output.rows} {params.tracking} > {log} 2>&1"
