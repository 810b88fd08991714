rule build_bundle:
    input:
        unpack(bundle_inputs),
        base=BASE_FILES,
        template=template_file,  # editing the served template rebuilds the bundle
    output:
        directory("bundles/{bundle}"),
    log:
        "logs/bundles/{bundle}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=lambda wc: as_json(CFG["bundles"][wc.bundle]),
        source=bundle_source,
        # Before the round is judged (a dry run) the inputs are only the checkpoint's output.
        compare=lambda wc, input: input.get("compare", []),
        lineage=as_json({a: CFG["arms"][a]["lineage"] for a in ARM_IDS}),
        arms=report_arms,  # the card reads the nominating round's LR sweep
        base=base_dir,
        template=lambda wc, input: input.template[0] if input.template else "chatml",
        search=prompt_search_flag,
    shell:
        "{ZYGOTE}python -m arenaflow.bundles.build build --bundle {wildcards.bundle} {params.source} "
        "--lineage-json {params.lineage:q} --arms-json {params.arms:q} --runs runs --corpora corpora --compare {params.compare} "
        "--base-model {params.base:q} --bundle-json {params.cfg:q} --chat-template {params.template:q} {params.search} "
        "--out {output} > {log} 2>&1"
