# One job per suite and arm: a process loads the model once and reads every regime x
# replicate of the suite (one parquet each, as compare, noise and the judged reads take them).
# A rule per suite, readout_<suite>, because suites differ in their regimes and replicates.
# A suite with `shards: N > 1` reads each arm in N shard jobs instead (readout_<suite>_shard,
# one GPU each, contiguous runs of whole batches: arenaflow.shards), each writing its part of
# every readout, and a CPU job merges the parts into the same readouts (merge_readouts_<suite>).
for _suite in CFG["evals"]:
    _shards = CFG["evals"][_suite]["shards"]

    rule:
        name:
            f"readout_{_suite}" + ("_shard" if _shards > 1 else "")
        input:
            pool=afpaths.pool(CFG["evals"][_suite]["pool"]),
            adapter=lambda wc: afdag.run_dirs(wc.rarm),
            base=BASE_FILES,
            chat=CHAT_TEMPLATE_FILE,
        output:
            [
                update(p)
                for p in (
                    afdag.readout_shard_outputs(CFG, _suite)
                    if _shards > 1
                    else afdag.suite_readouts(CFG, _suite)
                )
            ],
        log:
            f"logs/readouts/{_suite}/{{rarm}}" + (".{shard}.log" if _shards > 1 else ".log"),
        conda:
            "../envs/arenaflow.yaml"
        resources:
            **GPU_JOB,
        params:
            tracking=TRACKING,
            suite=_suite,
            # of the wildcards alone: Snakemake's params trigger skips a param that reads the
            # job's input or output, and a regime's decoding must rerun its readouts
            plan=lambda wc, s=_suite: afdag.readout_plan(CFG, s, wc.rarm),
            adapter=lambda wc, input: afdag.adapter_flag(input.adapter),
            seed=CFG["evals"][_suite]["seed"],
            batch=CFG["evals"][_suite]["batch_size"],
            engine=as_json(CFG["evals"][_suite]["engine"]),
            base=base_dir,
            chat=CHAT_TEMPLATE,
        shell:
            "python -m arenaflow.evals.readout readout --suite {params.suite} --arm {wildcards.rarm} "
            "--pool {input.pool} --base-model {params.base:q} --chat-template {params.chat:q} {params.adapter} "
            "--plan {params.plan:q} --seed {params.seed} --batch-size {params.batch} "
            "--engine-json {params.engine:q} "
            + ("--shard {wildcards.shard} " if _shards > 1 else "")
            + "{params.tracking} > {log} 2>&1"

    if _shards > 1:

        rule:
            name:
                f"merge_readouts_{_suite}"
            input:
                afdag.readout_shards(CFG, _suite),
            output:
                [update(p) for p in afdag.suite_readouts(CFG, _suite)],
            log:
                f"logs/readouts/{_suite}/{{rarm}}.merge.log",
            conda:
                "../envs/arenaflow.yaml"
            params:
                plan=lambda wc, s=_suite: afdag.readout_plan(CFG, s, wc.rarm),
                shards=_shards,
            shell:
                "python -m arenaflow.evals.readout_merge --plan {params.plan:q} "
                "--shards {params.shards} > {log} 2>&1"


# A prompt search's readouts (regimes R-<prompt> and R-none, arenaflow.config): one job each,
# made only when a search asks for them, not with every readout of the arm.
rule readout_search:
    input:
        pool=lambda wc: afpaths.pool(suite(wc)["pool"]),
        adapter=lambda wc: afdag.run_dirs(wc.rarm),
        base=BASE_FILES,
        chat=CHAT_TEMPLATE_FILE,
    output:
        update(afpaths.READOUT),
    log:
        "logs/readouts/{suite}/{rarm}/{regime}.r{rep}.log",
    wildcard_constraints:
        regime=ids(SEARCH_REGIMES),
    conda:
        "../envs/arenaflow.yaml"
    resources:
        **GPU_JOB,
    params:
        regime=lambda wc: as_json(afdag.regime_decoding(CFG, wc.suite, wc.regime)),
        adapter=lambda wc, input: afdag.adapter_flag(input.adapter),
        seed=lambda wc: suite(wc)["seed"],
        batch=lambda wc: suite(wc)["batch_size"],
        engine=lambda wc: as_json(suite(wc)["engine"]),
        system=lambda wc: afschema.system_prompt_of(CFG, wc.suite, wc.regime),
        base=base_dir,
        chat=CHAT_TEMPLATE,
    shell:
        "python -m arenaflow.evals.readout readout --suite {wildcards.suite} --arm {wildcards.rarm} "
        "--pool {input.pool} --base-model {params.base:q} --chat-template {params.chat:q} {params.adapter} "
        "--regime {wildcards.regime} --regime-json {params.regime:q} --replicate {wildcards.rep} "
        "--seed {params.seed} --batch-size {params.batch} --engine-json {params.engine:q} --system-prompt={params.system:q} "
        "--out {output} > {log} 2>&1"


# Pools every replicate of the regime; reports each replicate and the paired t over replicates.
rule compare:
    input:
        cand=lambda wc: readouts(wc.suite, wc.rarm, wc.regime),
        ref=lambda wc: readouts(wc.suite, wc.ref, wc.regime),
    output:
        update(afpaths.COMPARE),
    log:
        "logs/compare/{suite}/{regime}/{rarm}__{ref}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.evals.compare compare --suite {wildcards.suite} --regime {wildcards.regime} "
        "--cand {input.cand} --ref {input.ref} --out {output} > {log} 2>&1"


# An arm against itself across its K >= 2 replicates: what a real effect has to exceed.
rule noise:
    input:
        lambda wc: readouts(wc.suite, wc.rarm, wc.regime),
    output:
        update(afpaths.NOISE),
    log:
        "logs/noise/{suite}/{regime}/{rarm}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.evals.compare noise --suite {wildcards.suite} --regime {wildcards.regime} "
        "--readouts {input} --out {output} > {log} 2>&1"


# Failure analysis by checker reason (instruction-following suites): per constraint family, the
# prompts carrying it, failing it, and fixed / lost against the reference.
rule failure_table:
    input:
        pool=lambda wc: afpaths.pool(suite(wc)["pool"]),
        cand=lambda wc: readouts(wc.suite, wc.rarm, wc.regime),
        ref=lambda wc: readouts(wc.suite, wc.ref, wc.regime),
    output:
        update(afpaths.FAILURES),
    log:
        "logs/failures/{suite}/{regime}/{rarm}__{ref}.log",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "python -m arenaflow.evals.failures --pool {input.pool} --cand {input.cand} --ref {input.ref} "
        "--out {output} > {log} 2>&1"


# A multiple-choice capability guard, scored by log-likelihood (lm-eval's acc and acc_norm).
rule mc_guard:
    input:
        mc=lambda wc: afdag.in_repo(REPO, CFG["mc_guards"][wc.guard]["items"]),
        adapter=lambda wc: afdag.run_dirs(wc.rarm),
        base=BASE_FILES,
    output:
        update(afpaths.GUARD),
    log:
        "logs/guards/{guard}/{rarm}.log",
    conda:
        "../envs/arenaflow.yaml"
    resources:
        **GPU_JOB,
    params:
        adapter=lambda wc, input: afdag.adapter_flag(input.adapter),
        base=base_dir,
    shell:
        "python -m arenaflow.evals.mcguard --items {input.mc} --base-model {params.base:q} "
        "{params.adapter} --arm {wildcards.rarm} --out {output} > {log} 2>&1"


# System-prompt search: one arm under each of a suite's system_prompts and none, paired.
rule prompt_search:
    input:
        unpack(lambda wc: afdag.search_readouts(CFG, wc.search)),
    output:
        update(afpaths.PROMPT_SEARCH),
    log:
        "logs/prompt_search/{search}.log",
    conda:
        "../envs/arenaflow.yaml"
    params:
        flags=lambda wc, input: afdag.search_flags(CFG, wc.search, input),
    shell:
        "python -m arenaflow.evals.promptsearch --search {wildcards.search} {params.flags} "
        "--out {output} > {log} 2>&1"
