rule train_arm:
    input:
        corpus=lambda wc: [afpaths.corpus_manifest(c) for c in arm(wc)["mix"]],
        init=lambda wc: afdag.run_dirs(arm(wc)["init"]),
        arm_file=lambda wc: arm(wc)["file"],
        base=BASE_FILES,
        chat=CHAT_TEMPLATE_FILE,
        budget=budget_gate,  # [] or a refusal naming the arm, before any sbatch (rules/common.smk)
    output:
        update(directory(afpaths.RUN)),
    log:
        "logs/train/{arm}.log",
    wildcard_constraints:
        arm=ids(TRAINED_IDS),
    conda:
        "../envs/arenaflow.yaml"
    threads: lambda wc: hyper(wc)["nproc"]
    resources:
        mem_mb=lambda wc: hyper(wc)["mem_mb"],
        runtime=lambda wc: hyper(wc)["runtime_min"],
        # a resource, not a param: the checkpoint cadence never changes the weights
        checkpoint_every=lambda wc: hyper(wc)["checkpoint_every"],
        nproc=lambda wc: hyper(wc)["nproc"],
        # One Slurm task (per node) holding all of the arm's GPUs (of that node); torchrun starts
        # the ranks. Several nodes: the plugin's MPI path runs the job script on the first node
        # (mpi), which calls srun itself; tasks_per_gpu=0 keeps --ntasks-per-gpu off.
        gres=lambda wc: f"gpu:{hyper(wc)['nproc']}",
        # Local runs cap the GPUs their jobs hold at once with this (profiles/gpu-local): not
        # `gpu`, which the Slurm plugin turns into --gpus beside the GRES above.
        local_gpus=lambda wc: hyper(wc)["nproc"],
        nodes=lambda wc: hyper(wc)["nodes"],
        mpi=lambda wc: "srun" if hyper(wc)["nodes"] > 1 else None,
        tasks=lambda wc: hyper(wc)["nodes"] if hyper(wc)["nodes"] > 1 else None,
        tasks_per_gpu=lambda wc: 0 if hyper(wc)["nodes"] > 1 else None,
    params:
        tracking=TRACKING,
        hyper=lambda wc: arm(wc)["params_json"],
        engine=lambda wc: as_json(arm(wc)["engine"]),
        init=lambda wc, input: input.init[0] if input.init else "base",
        corpus=lambda wc, input: " ".join(str(Path(m).parent) for m in input.corpus),
        corpus_id=lambda wc: arm(wc)["corpus"],
        mix=lambda wc, input: afdag.mix_flags(arm(wc), input.arm_file),
        launcher=lambda wc: afdag.launcher(hyper(wc)),
        base=base_dir,
        base_name=CFG["base"]["name"],
        chat=CHAT_TEMPLATE,
        base_rev=f"--base-revision {CFG['base']['revision']}" if "revision" in CFG["base"] else "",
    shell:
        "OMP_NUM_THREADS={threads} {params.launcher} -m arenaflow.train --arm {wildcards.arm} "
        "--params-json {params.hyper:q} --engine-json {params.engine:q} --checkpoint-every {resources.checkpoint_every} --corpus {params.corpus} --corpus-id {params.corpus_id:q} {params.mix} "
        "--init {params.init} --base-model {params.base:q} --chat-template {params.chat:q} --base-name {params.base_name:q} "
        "{params.base_rev} --out {output} {params.tracking} > {log} 2>&1"
