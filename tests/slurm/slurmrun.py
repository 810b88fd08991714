"""Running the workflow on the test cluster of scripts/slurm-local.sh, shared by tests/slurm's
test modules: the cluster check (skip, or fail under ARENAFLOW_SLURM_TESTS=required), a test's
folders, Snakemake through the test profile or locally, and reading the jobs back from Slurm's
own records (`scontrol show job`) and from the plugin's sbatch calls (`--verbose`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "tests/slurm/profile"
TIMEOUT = int(os.environ.get("ARENAFLOW_SLURM_TEST_TIMEOUT", "900"))  # per Snakemake call, seconds
# The smallest DAG that runs every rule (tests/e2e/mini.yaml)
CONFIGS = [
    str(REPO / f) for f in ("config/config.yaml", "tests/e2e/config.yaml", "tests/e2e/mini.yaml")
]


def output(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()


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


def usable_nodes() -> list[str]:
    rows = (line.split() for line in output("sinfo", "-h", "-N", "-o", "%N %t").splitlines())
    return sorted({n for n, s in rows if s.rstrip("*~#") in ("idle", "mix", "alloc")})


def require_cluster(nodes: int = 1) -> list[str]:
    """The usable nodes of the cluster, at least `nodes` of them; else the test is skipped with
    the reason (failed with ARENAFLOW_SLURM_TESTS=required, as .ci/run sets)."""
    why = cluster_problem()
    usable = [] if why else usable_nodes()
    if why is None and len(usable) < nodes:
        why = f"{len(usable)} usable Slurm node(s) {usable}, {nodes} wanted"
    if why:
        env = "" if nodes == 1 else f"ARENAFLOW_SLURM_NODES={nodes} "
        msg = (
            f"{why}; start {'one' if nodes == 1 else nodes} with `{env}bash scripts/slurm-local.sh`"
        )
        if os.environ.get("ARENAFLOW_SLURM_TESTS") == "required":
            pytest.fail(msg)
        pytest.skip(msg)
    return usable


def workdir(root: Path) -> dict:
    """A test's folders under `root`: results, and arms (a copy of config/arms: tests add arms)."""
    arms, results = root / "arms", root / "results"
    shutil.copytree(REPO / "config/arms", arms)
    return {"root": root, "arms": arms, "results": results}


def _snakemake(*args: str, timeout: int, configs: list[str], config: list[str]) -> list[str]:
    # as tests/e2e/dagrun.py's command(): targets first, the config files, then --config
    return [
        "timeout",
        "-k",
        "30",
        str(timeout),
        sys.executable,
        "-m",
        "snakemake",
        *args,
        "--configfile",
        *configs,
        "--config",
        *config,
    ]


def snakemake_cmd(
    *args: str,
    results: Path,
    arms: Path,
    logdir: Path,
    timeout: int = TIMEOUT,
    configs: list[str] = CONFIGS,
) -> list[str]:
    """Snakemake ARGS through the test profile, every job a Slurm job, its log under `logdir`."""
    opts = ("--profile", str(PROFILE), "--slurm-logdir", str(logdir), "--verbose")
    config = [f"results_dir={results}", f"arms_dir={arms}"]
    return _snakemake(*args, *opts, timeout=timeout, configs=configs, config=config)


def run_locally(*targets: str, results: Path, arms: Path, configs: list[str] = CONFIGS) -> str:
    """Snakemake `targets` in this process's machine (the default executor, 2 cores), asserted to
    succeed; its output."""
    config = [f"results_dir={results}", f"arms_dir={arms}"]
    cmd = _snakemake(*targets, "--cores", "2", timeout=TIMEOUT, configs=configs, config=config)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT + 90)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc.stdout + proc.stderr


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


def squeue(*args: str) -> str:
    return subprocess.run(
        ["squeue", "-h", *args], capture_output=True, text=True, timeout=30
    ).stdout.strip()


def in_background(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """The command in a session of its own, so that kill() reaches Snakemake under `timeout`."""
    with open(log, "w") as f:
        return subprocess.Popen(
            cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip


def kill(sm: subprocess.Popen) -> None:
    """Snakemake and everything it started here (its Slurm jobs are scancel'd by their tests)."""
    try:
        os.killpg(sm.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    sm.wait()


def finished(sm: subprocess.Popen, log: Path, timeout: float) -> str:
    """Snakemake's output, once it has exited 0 (it is killed if it outlives `timeout`)."""
    try:
        sm.wait(timeout=max(1.0, timeout))
    finally:
        if sm.poll() is None:
            kill(sm)
    out = log.read_text()
    assert sm.returncode == 0, out[-8000:]
    return out


def running_job(comment_part: str, deadline: float) -> str:
    while time.time() < deadline:
        for line in squeue("-o", "%i|%k|%T").splitlines():
            jid, comment, state = line.split("|")
            if comment_part in comment and state == "RUNNING":
                return jid
        time.sleep(0.5)
    raise AssertionError(f"no RUNNING Slurm job with {comment_part!r} in its comment:\n{squeue()}")


def training_at_checkpoint(sm, results: Path, arm: str, log: Path, deadline: float) -> str:
    """The id of arm's running training job, once its first checkpoint is whole (its
    fingerprint is written last)."""
    first = results / f"runs/{arm}/checkpoints/fingerprint.json"
    while not first.exists() and sm.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert first.exists(), f"no checkpoint of {arm}:\n{log.read_text()[-4000:]}"
    return running_job(f"train_arm_wildcards_{arm}", deadline)


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
