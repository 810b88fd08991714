rule build_pool:
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
