def corpus_candidates(wc):
    if CFG["corpora"][wc.corpus]["policy"] == "reference":
        return {}
    return {
        "samples": f"candidates/{wc.corpus}/samples.jsonl",
        "verdicts": f"candidates/{wc.corpus}/verdicts.jsonl",
    }


def eval_pools(wc):
    """Every evaluation pool, to decontaminate the corpus against (unless it opts out)."""
    if not CFG["corpora"][wc.corpus]["decontaminate"]:
        return []
    return sorted({f"pools/{s['pool']}.jsonl" for s in CFG["evals"].values()})


def candidate_flags(wc, input):
    if "verdicts" not in input.keys():
        return ""
    return f"--samples {input.samples} --verdicts {input.verdicts}"


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
    params:
        cfg=lambda wc: as_json(CFG["corpora"][wc.corpus]),
        candidates=candidate_flags,
        evals=lambda wc, input: f"--eval-pools {' '.join(input.evals)}" if input.evals else "",
        system=CFG["system_prompt"],
        base=BASE,
    log:
        "logs/corpora/{corpus}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.corpora --corpus {wildcards.corpus} --pool {input.pool} "
        "{params.candidates} {params.evals} --tokenizer {params.base:q} --system-prompt {params.system:q} "
        "--params-json {params.cfg:q} --out corpora/{wildcards.corpus} > {log} 2>&1"
