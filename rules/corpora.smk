rule build_corpus:
    input:
        unpack(corpus_candidates),
        pool=corpus_pool,
        evals=eval_pools,
        base=BASE_FILES,
    output:
        # sft.npz or pairs.npz (format: pairs) is listed in the manifest
        rows="corpora/{corpus}/rows.jsonl",
        stats="corpora/{corpus}/stats.json",
        manifest="corpora/{corpus}/manifest.json",
    log:
        "logs/corpora/{corpus}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=lambda wc: as_json(CFG["corpora"][wc.corpus]),
        candidates=candidate_flags,
        evals=lambda wc, input: f"--eval-pools {' '.join(input.evals)}" if input.evals else "",
        system=CFG["system_prompt"],
        base=base_dir,
    shell:
        "{ZYGOTE}python -m arenaflow.corpora.build --corpus {wildcards.corpus} --pool {input.pool} "
        "{params.candidates} {params.evals} --tokenizer {params.base:q} --system-prompt={params.system:q} "
        "--params-json {params.cfg:q} --out corpora/{wildcards.corpus} > {log} 2>&1"
