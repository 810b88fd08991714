rule build_pool:
    input:
        src=lambda wc: afdag.pool_file(CFG, REPO, wc.pool),
        exclude=lambda wc: afdag.pool_excludes(CFG, wc.pool),  # read by arenaflow.pools.build from the section's `exclude` ids
    output:
        rows=update(afpaths.POOL),
        manifest=update(afpaths.POOL_MANIFEST),
    log:
        "logs/pools/{pool}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=lambda wc: as_json(CFG["pools"][wc.pool]),
    shell:
        "python -m arenaflow.pools.build --pool {wildcards.pool} --params-json {params.cfg:q} "
        "--out {output.rows} > {log} 2>&1"
