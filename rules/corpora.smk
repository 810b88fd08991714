rule build_corpus:
    input:
        unpack(lambda wc: afdag.corpus_candidates(CFG, wc.corpus)),
        pool=lambda wc: afdag.corpus_pool(CFG, wc.corpus),
        evals=lambda wc: afdag.eval_pools(CFG, wc.corpus),
        base=BASE_FILES,
        chat=CHAT_TEMPLATE_FILE,
    output:
        # sft.npz or pairs.npz (format: pairs) is listed in the manifest
        rows=update(afpaths.CORPUS_ROWS),
        stats=update(afpaths.CORPUS_STATS),
        manifest=update(afpaths.CORPUS_MANIFEST),
    log:
        "logs/corpora/{corpus}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=lambda wc: as_json(CFG["corpora"][wc.corpus]),
        candidates=lambda wc, input: afdag.candidate_flags(
            input.get("samples"), input.get("verdicts")
        ),
        evals=lambda wc, input: f"--eval-pools {' '.join(input.evals)}" if input.evals else "",
        system=CFG["system_prompt"],
        base=base_dir,
        chat=CHAT_TEMPLATE,
        out=lambda wc: afpaths.corpus(wc.corpus),
    shell:
        "python -m arenaflow.corpora.build --corpus {wildcards.corpus} --pool {input.pool} "
        "{params.candidates} {params.evals} --tokenizer {params.base:q} --chat-template {params.chat:q} --system-prompt={params.system:q} "
        "--params-json {params.cfg:q} --out {params.out} > {log} 2>&1"
