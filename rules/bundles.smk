rule build_bundle:
    input:
        unpack(lambda wc: afdag.bundle_inputs(CFG, wc.bundle, bundle_arm(wc))),
        base=BASE_FILES,
        chat=CHAT_TEMPLATE_FILE,
        template=lambda wc: afdag.template_file(CFG, REPO, wc.bundle),  # editing the served template rebuilds the bundle
    output:
        update(directory(afpaths.BUNDLE)),
    log:
        "logs/bundles/{bundle}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=lambda wc: as_json(CFG["bundles"][wc.bundle]),
        source=lambda wc: afdag.bundle_source(CFG, wc.bundle),
        # Before the round is judged (a dry run) the inputs are only the checkpoint's output.
        compare=lambda wc, input: input.get("compare", []),
        lineage=as_json({a: CFG["arms"][a]["lineage"] for a in ARM_IDS}),
        arms=afrounds.report_arms(CFG),  # the card reads the nominating round's LR sweep
        base=base_dir,
        template=lambda wc, input: (
            input.template[0] if input.template else afdag.bundle_template(CFG, wc.bundle)
        ),
        chat=CHAT_TEMPLATE,
        search=lambda wc, input: (
            f"--prompt-search {input.prompt_search}" if "prompt_search" in input.keys() else ""
        ),
    shell:
        "python -m arenaflow.bundles.build build --bundle {wildcards.bundle} {params.source} "
        "--lineage-json {params.lineage:q} --arms-json {params.arms:q} --runs runs --corpora corpora --compare {params.compare} "
        "--base-model {params.base:q} --bundle-json {params.cfg:q} --chat-template {params.template:q} --base-chat-template {params.chat:q} {params.search} "
        "--out {output} > {log} 2>&1"
