def pool_file(wc):
    """An imported pool's source file, so editing it rebuilds the pool."""
    f = CFG["pools"][wc.pool].get("file")
    return [] if f is None else [f if Path(f).is_absolute() else str(REPO / f)]


rule build_pool:
    input:
        pool_file,
    output:
        "pools/{pool}.jsonl",
    params:
        cfg=lambda wc: as_json(CFG["pools"][wc.pool]),
    log:
        "logs/pools/{pool}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.pools --pool {wildcards.pool} --params-json {params.cfg:q} "
        "--out {output} > {log} 2>&1"
