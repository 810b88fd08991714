def arm(wc):
    return CFG["arms"][wc.arm]


def launcher(wc):
    # One task that starts its own ranks: the Slurm plugin's gpu=N can start a script twice.
    n = arm(wc)["hyper"]["nproc"]
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
        hyper=lambda wc: as_json(arm(wc)["hyper"]),
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
        nproc=lambda wc: arm(wc)["hyper"]["nproc"],
        # One Slurm task holding all of the arm's GPUs; torchrun starts the ranks.
        gres=lambda wc: f"gpu:{arm(wc)['hyper']['nproc']}",
    conda:
        "../envs/arenaflow.yaml"
    shell:
        "OMP_NUM_THREADS={threads} {params.launcher} -m arenaflow.train --arm {wildcards.arm} "
        "--params-json {params.hyper:q} --corpus corpora/{params.corpus} --corpus-id {params.corpus} "
        "--init {params.init} --base-model {params.base:q} --base-name {params.base_name:q} "
        "{params.base_rev} --out {output} > {log} 2>&1"
