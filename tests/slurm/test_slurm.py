"""The end-to-end config through a real Slurm cluster (scripts/slurm-local.sh: one node or two, 4
fake GPUs each as character devices, munge, slurmctld, slurmd, no slurmdbd).

    ARENAFLOW_SLURM_NODES=2 bash scripts/slurm-local.sh && python -m pytest -q tests/slurm

Skipped, with the reason, when `sinfo` is absent or the cluster does not answer with a usable
node; with ARENAFLOW_SLURM_TESTS=required (.ci/run) that is a failure instead. Every Snakemake
call is bounded by `timeout -k`.

What is checked, from Slurm's own records (`scontrol show job`), the plugin's sbatch calls
(`--verbose`) and each training job's environment (training_evidence.json's gpu_env):
  - the smallest DAG that runs every rule (tests/e2e/mini.yaml), to round r3's nomination (or
    bundles/B3f, see TARGET), runs under --profile tests/slurm/profile, every job a Slurm job
    (register_bar is local);
  - GPU rules (train_arm, sample_candidates, readout) were submitted with --gres=gpu:N and no
    --gpus/--ntasks-per-gpu; training ran with SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES set;
  - CPU rules (build_pool, build_corpus, verify_candidates, compare, noise, nominate,
    build_bundle) got no GPU;
  - preemption, two ways: a training job that dies after its step-10 checkpoint is resubmitted
    by Snakemake (--retries) and resumes from it; a running training job requeued by Slurm
    (`scontrol requeue`) restarts as the same job and resumes from its checkpoint. Both end at
    the weights of an uninterrupted run.
Two nodes: tests/slurm/test_two_nodes.py. What both share (the cluster check, a test's folders,
Snakemake through the profile or locally, reading the jobs back): tests/slurm/slurmrun.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from slurmrun import (
    REPO,
    TIMEOUT,
    assert_resumed_to_the_same_weights,
    finished,
    gres_count,
    in_background,
    kill,
    require_cluster,
    rule_of,
    run_id,
    run_locally,
    sbatch_calls,
    slurm_jobs,
    snakemake_cmd,
    squeue,
    training_at_checkpoint,
    workdir,
)

# To round r3's nomination: every GPU rule and the CPU rules up to the checkpoint. bundles/B3f
# adds the served readouts of the lineage and the bundle (~2 min more on 2 cores):
# ARENAFLOW_SLURM_E2E_TARGET=bundles/B3f.
TARGET = os.environ.get("ARENAFLOW_SLURM_E2E_TARGET", "nominations/r3.json")
pytestmark = pytest.mark.slurm

GPU_RULES = {"train_arm", "sample_candidates", "readout_math"}  # a readout rule per suite
CPU_RULES = {
    "build_pool",
    "build_corpus",
    "verify_candidates",
    "compare",
    "noise",
    "nominate",
    "merge_arm",
    "build_bundle",
    "round_report",
}


@pytest.fixture(scope="module", autouse=True)
def cluster():
    require_cluster(1)


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm_e2e")
    w = workdir(root)
    arms, results, logdir = w["arms"], w["results"], root / "slurm_logs"
    cmd = snakemake_cmd(TARGET, results=results, arms=arms, logdir=logdir)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT + 90)
    wall = time.time() - t0
    out = proc.stdout + proc.stderr
    (root / "snakemake.log").write_text(out)
    assert proc.returncode == 0, (
        f"{' '.join(cmd[:12])} ... failed (rc {proc.returncode}) after {wall:.0f} s:\n{out[-8000:]}"
    )
    print(f"\nthe e2e DAG to {TARGET} under Slurm: {wall:.0f} s wall ({root})")
    uuid = run_id(out)
    return {
        "root": root,
        "results": results,
        "arms": arms,
        "logdir": logdir,
        "out": out,
        "uuid": uuid,
        "jobs": slurm_jobs(uuid),
        "calls": sbatch_calls(out),
        "wall_s": wall,
    }


def test_the_dag_runs_as_slurm_jobs(e2e):
    assert json.loads((e2e["results"] / "nominations/r3.json").read_text())["promoted"]
    if TARGET.startswith("bundles/"):
        bundle = e2e["results"] / TARGET
        assert (
            json.loads((bundle / "reload_check.json").read_text())["verdict"] == "RELOAD_CHECK_PASS"
        )
    rules = {rule_of(j["Comment"]) for j in e2e["jobs"]}
    assert GPU_RULES <= rules, rules
    assert {"build_pool", "verify_candidates", "build_corpus", "compare", "nominate"} <= rules, (
        rules
    )
    assert "register_bar" not in rules  # a localrule: it runs in the main process
    bad = [
        (j["JobId"], j["Comment"], j["JobState"])
        for j in e2e["jobs"]
        if j["JobState"] != "COMPLETED"
    ]
    assert not bad, bad


def test_gpu_rules_asked_for_gres_and_cpu_rules_for_no_gpu(e2e):
    assert e2e["calls"], "no sbatch call in the --verbose output"
    for comment, calls in e2e["calls"].items():
        rule = rule_of(comment)
        for opts in calls:
            assert "--gpus" not in opts and "--ntasks-per-gpu" not in opts, opts
            if rule in GPU_RULES:
                assert re.search(r"--gres=gpu:\d+", opts), opts
            else:
                assert "--gres" not in opts, opts
    for j in e2e["jobs"]:
        rule, n = rule_of(j["Comment"]), gres_count(j.get("TresPerNode"))
        if rule in GPU_RULES:
            assert n >= 1, j
        else:
            assert rule in CPU_RULES, j["Comment"]
            assert n == 0 and "gpu" not in j.get("TresPerNode", "") + j.get("TRES", ""), j


def test_training_ran_with_its_gpus_in_the_environment(e2e):
    train = {j["JobId"]: j for j in e2e["jobs"] if rule_of(j["Comment"]) == "train_arm"}
    runs = sorted((e2e["results"] / "runs").glob("*/final/training_evidence.json"))
    assert {p.parent.parent.name for p in runs} == {"S1", "R220", "R2d", "B3"}
    for p in runs:
        ev = json.loads(p.read_text())
        job = train.get(ev["job_id"])
        assert job is not None, f"{p}: job {ev['job_id']} is not a train_arm job of this run"
        nproc = ev["hyperparameters"]["nproc"]
        assert gres_count(job.get("TresPerNode")) == nproc, job
        env = ev["gpu_env"]
        gpus = env["SLURM_JOB_GPUS"] or env["SLURM_STEP_GPUS"]
        assert gpus and len(gpus.split(",")) == nproc, env
        assert (
            env["CUDA_VISIBLE_DEVICES"] and len(env["CUDA_VISIBLE_DEVICES"].split(",")) == nproc
        ), env


# ---- preemption -------------------------------------------------------------------------
PREEMPT_HYPER = {
    "epochs": 20,
    "lr": 2.0e-3,
    "micro_batch_size": 8,
    "grad_accum": 2,
    "max_steps": 60,
    "checkpoint_every": 10,
}


@pytest.fixture(scope="module")
def uninterrupted(e2e):
    """Arms P0-P2 share PREEMPT_HYPER; P0 trains locally (the default profile) without a break
    and is the reference for the interrupted P1 and P2. Runs in the e2e results, where pools and
    corpora exist: only training is left."""
    arms, results = e2e["arms"], e2e["results"]
    for arm in ("P0", "P1", "P2"):
        (arms / f"{arm}.yaml").write_text(
            f"init: base\ncorpus: sft_s1\nhyper: {json.dumps(PREEMPT_HYPER)}\n"
        )
    out = run_locally("runs/P0/final", results=results, arms=arms)
    assert "rule train_arm" in out and "rule build_corpus" not in out
    return results / "runs/P0/final"


def test_a_killed_training_job_is_retried_under_slurm_and_resumes_to_the_same_weights(
    e2e, uninterrupted
):
    """Attempt 1 dies right after its step-10 checkpoint (ARENAFLOW_FAIL_AFTER_STEP=10, exit 75,
    as a killed job would); Snakemake resubmits it to Slurm (--retries 1) and the new job resumes
    at step 10. The weights equal the uninterrupted run's."""
    results, root = e2e["results"], e2e["root"]
    logdir, log = root / "slurm_logs_preempt", root / "snakemake_preempt.log"
    cmd = snakemake_cmd(
        "runs/P1/final", "--retries", "1", results=results, arms=e2e["arms"], logdir=logdir
    )
    sm = in_background(cmd, log, env={**os.environ, "ARENAFLOW_FAIL_AFTER_STEP": "10"})
    out = finished(sm, log, TIMEOUT + 60)

    jobs = slurm_jobs(run_id(out))
    assert {rule_of(j["Comment"]) for j in jobs} == {"train_arm"}, (
        "pools and corpora were not reused"
    )
    attempts = sorted(jobs, key=lambda j: int(j["JobId"]))
    assert [j["JobState"] for j in attempts] == ["FAILED", "COMPLETED"], attempts
    first_log = (logdir / "rule_train_arm/P1" / f"{attempts[0]['JobId']}.log").read_text()
    assert (
        "returned non-zero exit status 75" in first_log
    )  # the training's own exit, as if preempted
    assert all(gres_count(j.get("TresPerNode")) == 1 for j in attempts)
    assert_resumed_to_the_same_weights(results, "P1", attempts[1]["JobId"], {10}, uninterrupted)


def test_a_training_job_requeued_by_slurm_resumes_in_the_same_job_to_the_same_weights(
    e2e, uninterrupted
):
    """`scontrol requeue` of the running training job once its step-10 checkpoint exists, as a
    preempting scheduler does: Slurm restarts the same job (Restarts=1), Snakemake keeps waiting
    on it (slurm-requeue: true; no resubmission) and the job resumes from its checkpoint to the
    uninterrupted run's weights."""
    results, root = e2e["results"], e2e["root"]
    log = root / "snakemake_requeue.log"
    cmd = snakemake_cmd(
        "runs/P2/final", results=results, arms=e2e["arms"], logdir=root / "slurm_logs_requeue"
    )
    deadline = time.time() + TIMEOUT
    sm = in_background(cmd, log)
    try:
        jid = training_at_checkpoint(sm, results, "P2", log, deadline)
        subprocess.run(["scontrol", "requeue", jid], check=True, timeout=30)
        # Slurm holds a requeued job ~2 min (BeginTime); an administrator's StartTime=now skips it
        while squeue("-j", jid, "-o", "%T") != "PENDING" and time.time() < deadline:
            time.sleep(0.2)
        subprocess.run(
            ["scontrol", "update", f"jobid={jid}", "StartTime=now"], check=True, timeout=30
        )
    except BaseException:
        kill(sm)
        raise
    out = finished(sm, log, deadline - time.time())

    jobs = slurm_jobs(run_id(out))
    assert [(j["JobId"], j["JobState"], j["Restarts"]) for j in jobs] == [
        (jid, "COMPLETED", "1")
    ], jobs
    # the requeue lands a few steps after the first checkpoint: the resume is from step 10 or a
    # later one
    assert_resumed_to_the_same_weights(results, "P2", jid, {10, 20, 30, 40, 50}, uninterrupted)
