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
Two nodes: tests/slurm/test_two_nodes.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "tests/slurm/profile"
TIMEOUT = int(os.environ.get("ARENAFLOW_SLURM_TEST_TIMEOUT", "900"))  # per Snakemake call, seconds
# The smallest DAG that runs every rule (tests/e2e/mini.yaml), to round r3's nomination: every
# GPU rule and the CPU rules up to the checkpoint. bundles/B3f adds the served readouts of the
# lineage and the bundle (~2 min more on 2 cores): ARENAFLOW_SLURM_E2E_TARGET=bundles/B3f.
CONFIGS = [
    str(REPO / f) for f in ("config/config.yaml", "tests/e2e/config.yaml", "tests/e2e/mini.yaml")
]
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


def cluster_problem() -> str | None:
    if shutil.which("sinfo") is None:
        return "sinfo is not installed (no Slurm client)"
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s (no slurm.conf, or no slurmctld)"
    if proc.returncode != 0:
        return f"the Slurm cluster is not up (sinfo: {proc.stderr.strip()[:300]})"
    states = proc.stdout.split()
    if not any(s.rstrip("*~#") in ("idle", "mix", "alloc") for s in states):
        return f"no usable Slurm node (sinfo states: {states or 'none'})"
    return None


@pytest.fixture(scope="module", autouse=True)
def cluster():
    why = cluster_problem()
    if why:
        msg = f"{why}; start one with `bash scripts/slurm-local.sh`"
        if os.environ.get("ARENAFLOW_SLURM_TESTS") == "required":
            pytest.fail(msg)
        pytest.skip(msg)


def snakemake_cmd(
    *args: str, results: Path, arms: Path, logdir: Path, timeout: int = TIMEOUT
) -> list[str]:
    # as tests/e2e/test_dag.py's snakemake(): targets first, both config files, then --config
    return [
        "timeout",
        "-k",
        "30",
        str(timeout),
        sys.executable,
        "-m",
        "snakemake",
        *args,
        "--profile",
        str(PROFILE),
        "--slurm-logdir",
        str(logdir),
        "--verbose",
        "--configfile",
        *CONFIGS,
        "--config",
        f"results_dir={results}",
        f"arms_dir={arms}",
    ]


def run_id(output: str) -> str:
    m = re.search(r"SLURM run ID: (\S+)", output)
    assert m, f"no 'SLURM run ID' in Snakemake's output:\n{output[-3000:]}"
    return m.group(1)


def rule_of(comment: str) -> str:
    return comment.removeprefix("rule_").split("_wildcards_")[0]


def slurm_jobs(uuid: str) -> list[dict]:
    """Every job of the run as slurmctld records it (MinJobAge keeps finished jobs an hour)."""
    out = subprocess.run(
        ["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    jobs = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line.strip()]
    return [j for j in jobs if j.get("JobName") == uuid]


def sbatch_calls(output: str) -> dict[str, list[str]]:
    """comment -> the options of every sbatch call the plugin made (before --wrap)."""
    calls: dict[str, list[str]] = {}
    for line in output.splitlines():
        if "sbatch call: " in line:
            opts = line.split("sbatch call: ", 1)[1].split(" --wrap=", 1)[0]
            m = re.search(r"--comment '?([^' ]+)'?", opts)
            calls.setdefault(m.group(1) if m else "?", []).append(opts)
    return calls


def gres_count(tres_per_node: str | None) -> int:
    m = re.search(r"gres:gpu:(\d+)", tres_per_node or "")
    return int(m.group(1)) if m else 0


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm_e2e")
    arms, results, logdir = root / "arms", root / "results", root / "slurm_logs"
    shutil.copytree(REPO / "config/arms", arms)
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


def squeue(*args: str) -> str:
    return subprocess.run(
        ["squeue", "-h", *args], capture_output=True, text=True, timeout=30
    ).stdout.strip()


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
    local = [
        "timeout",
        "-k",
        "30",
        str(TIMEOUT),
        sys.executable,
        "-m",
        "snakemake",
        "runs/P0/final",
        "--cores",
        "2",
        "--configfile",
        *CONFIGS,
        "--config",
        f"results_dir={results}",
        f"arms_dir={arms}",
    ]
    proc = subprocess.run(local, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT + 90)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert (
        "rule train_arm" in proc.stdout + proc.stderr
        and "rule build_corpus" not in proc.stdout + proc.stderr
    )
    return results / "runs/P0/final"


def in_background(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(
            cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, text=True, env=env
        )


def finished(sm: subprocess.Popen, log: Path, timeout: float) -> str:
    """Snakemake's output, once it has exited 0 (it is killed if it outlives `timeout`)."""
    try:
        sm.wait(timeout=max(1.0, timeout))
    finally:
        if sm.poll() is None:
            sm.kill()
    out = log.read_text()
    assert sm.returncode == 0, out[-8000:]
    return out


def assert_resumed_to_the_same_weights(
    results: Path, arm: str, job_id: str, from_steps, whole: Path, steps: int = 60
) -> None:
    """runs/{arm} was finished by job `job_id`, resumed from a checkpoint at one of `from_steps`,
    and has the uninterrupted run's losses and weights."""
    import torch
    from safetensors.torch import load_file

    run = results / f"runs/{arm}/final"
    ev = json.loads((run / "training_evidence.json").read_text())
    assert ev["job_id"] == job_id and ev["optimizer_steps"] == steps, ev
    assert ev["resumed_from_step"] in from_steps, ev["resumed_from_step"]
    assert "resumed from" in (results / f"logs/train/{arm}.log").read_text()
    m = [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    r = [json.loads(x)["loss"] for x in (whole / "metrics.jsonl").read_text().splitlines()]
    assert m == pytest.approx(r, abs=1e-6)
    wa, wb = (
        load_file(whole / "adapter_model.safetensors"),
        load_file(run / "adapter_model.safetensors"),
    )
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-6, rtol=1e-5)
    assert not (run.parent / "checkpoints").exists(), "checkpoints outlived the final weights"


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


def running_job(comment_part: str, deadline: float) -> str:
    while time.time() < deadline:
        for line in squeue("-o", "%i|%k|%T").splitlines():
            jid, comment, state = line.split("|")
            if comment_part in comment and state == "RUNNING":
                return jid
        time.sleep(0.5)
    raise AssertionError(f"no RUNNING Slurm job with {comment_part!r} in its comment:\n{squeue()}")


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
    first_ckpt = (
        results / "runs/P2/checkpoints/fingerprint.json"
    )  # written once a checkpoint is whole
    deadline = time.time() + TIMEOUT
    sm = in_background(cmd, log)
    try:
        while not first_ckpt.exists() and sm.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert first_ckpt.exists(), f"no step-10 checkpoint:\n{log.read_text()[-4000:]}"
        jid = running_job("train_arm_wildcards_P2", deadline)
        subprocess.run(["scontrol", "requeue", jid], check=True, timeout=30)
        # Slurm holds a requeued job ~2 min (BeginTime); an administrator's StartTime=now skips it
        while squeue("-j", jid, "-o", "%T") != "PENDING" and time.time() < deadline:
            time.sleep(0.2)
        subprocess.run(
            ["scontrol", "update", f"jobid={jid}", "StartTime=now"], check=True, timeout=30
        )
    except BaseException:
        sm.kill()
        raise
    out = finished(sm, log, deadline - time.time())

    jobs = slurm_jobs(run_id(out))
    assert [(j["JobId"], j["JobState"], j["Restarts"]) for j in jobs] == [
        (jid, "COMPLETED", "1")
    ], jobs
    # the requeue lands a few steps after the first checkpoint: the resume is from step 10 or a
    # later one
    assert_resumed_to_the_same_weights(results, "P2", jid, {10, 20, 30, 40, 50}, uninterrupted)
