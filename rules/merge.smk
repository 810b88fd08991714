# A merge or dose arm (config/arms/<arm>.yaml with `merge:` or `dose:`): made in weight space from
# its parents' runs, streamed tensor by tensor on CPU (arenaflow.merge.build), no GPU and no training.
# Its output is a run like a trained arm's (runs/{arm}/final), so readouts, comparisons,
# nominations and bundles take it as they take any arm.
rule merge_arm:
    input:
        parents=lambda wc: afdag.merge_parents(arm(wc)),
        arm_file=lambda wc: arm(wc)["file"],
        base=BASE_FILES,
    output:
        update(directory(afpaths.RUN)),
    log:
        "logs/merge/{arm}.log",
    wildcard_constraints:
        arm=ids(MERGED_IDS),
    conda:
        "../envs/arenaflow.yaml"
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        spec=lambda wc: as_json(arm(wc)["merge"]),  # weights and rank: a change reruns the merge
        parents=lambda wc, input: afdag.merge_flags(arm(wc), input.parents),
        base=base_dir,
    shell:
        "python -m arenaflow.merge.build --arm {wildcards.arm} {params.parents} "
        "--base-model {params.base:q} --out {output} > {log} 2>&1"
