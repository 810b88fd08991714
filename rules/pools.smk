rule build_pool:
    input:
        src=pool_file,
        exclude=pool_excludes,
    output:
        afpaths.POOL,
    log:
        "logs/pools/{pool}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        cfg=lambda wc: as_json(CFG["pools"][wc.pool]),
    shell:
        "python -m arenaflow.pools --pool {wildcards.pool} --params-json {params.cfg:q} "
        "--exclude {input.exclude} --out {output} > {log} 2>&1"
