def arm(wc):
    return CFG["arms"][wc.arm]


def arm_nodes(wc):
    return arm(wc)["hyper"].get("nodes", 1)


def launcher(wc):
    # One task that starts its own ranks: the Slurm plugin's gpu=N can start a script twice.
    # Several nodes: srun starts one task per node, each a torchrun whose rendezvous comes from
    # the Slurm environment (arenaflow.launch: first host of SLURM_JOB_NODELIST, SLURM_NNODES,
    # SLURM_NODEID).
    n, k = arm(wc)["hyper"]["nproc"], arm_nodes(wc)
    if k > 1:
        return (f"srun --nodes {k} --ntasks-per-node 1 --kill-on-bad-exit=1 "
                f"python -m arenaflow.launch --nproc-per-node {n}")
    return "python" if n == 1 else f"torchrun --standalone --nproc_per_node {n}"


rule train_arm:
    input:
        corpus=lambda wc: f"corpora/{arm(wc)['corpus']}/manifest.json",
        init=lambda wc: run_dir(arm(wc)["init"]),
        arm_file=lambda wc: arm(wc)["file"],
        base=BASE_FILES,
        budget=budget_gate,  # [] or a refusal naming the arm, before any sbatch (rules/common.smk)
    output:
        directory("runs/{arm}/final"),
    params:
        hyper=lambda wc: afconfig.result_hyper(arm(wc)["hyper"]),
        init=lambda wc, input: input.init[0] if input.init else "base",
        corpus=lambda wc: arm(wc)["corpus"],
        launcher=launcher,
        base=BASE,
        base_name=CFG["base"]["name"],
        base_rev=("--base-revision " + CFG["base"]["revision"]) if "revision" in CFG["base"] else "",
    log:
        "logs/train/{arm}.log",
    threads: lambda wc: arm(wc)["hyper"]["nproc"]
    resources:
        mem_mb=lambda wc: arm(wc)["hyper"]["mem_mb"],
        runtime=lambda wc: arm(wc)["hyper"]["runtime_min"],
        # a resource, not a param: the checkpoint cadence never changes the weights
        checkpoint_every=lambda wc: arm(wc)["hyper"]["checkpoint_every"],
        nproc=lambda wc: arm(wc)["hyper"]["nproc"],
        # One Slurm task (per node) holding all of the arm's GPUs (of that node); torchrun starts
        # the ranks. Several nodes: the plugin's MPI path runs the job script on the first node
        # (mpi), which calls srun itself; tasks_per_gpu=0 keeps --ntasks-per-gpu off.
        gres=lambda wc: f"gpu:{arm(wc)['hyper']['nproc']}",
        # Local runs cap the GPUs their jobs hold at once with this (profiles/gpu-local): not
        # `gpu`, which the Slurm plugin turns into --gpus beside the GRES above.
        local_gpus=lambda wc: arm(wc)["hyper"]["nproc"],
        nodes=arm_nodes,
        mpi=lambda wc: "srun" if arm_nodes(wc) > 1 else None,
        tasks=lambda wc: arm_nodes(wc) if arm_nodes(wc) > 1 else None,
        tasks_per_gpu=lambda wc: 0 if arm_nodes(wc) > 1 else None,
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "OMP_NUM_THREADS={threads} {params.launcher} -m arenaflow.train --arm {wildcards.arm} "
        "--params-json {params.hyper:q} --checkpoint-every {resources.checkpoint_every} --corpus corpora/{params.corpus} --corpus-id {params.corpus} "
        "--init {params.init} --base-model {params.base:q} --base-name {params.base_name:q} "
        "{params.base_rev} --out {output} > {log} 2>&1"
