rule build_pool:
    input:
        src=pool_file,
        exclude=pool_excludes,  # read by arenaflow.pools.build from the section's `exclude` ids
    output:
        afpaths.POOL,
    log:
        "logs/pools/{pool}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=lambda wc: as_json(CFG["pools"][wc.pool]),
    shell:
        "{ZYGOTE}python -m arenaflow.pools.build --pool {wildcards.pool} --params-json {params.cfg:q} "
        "--out {output} > {log} 2>&1"
