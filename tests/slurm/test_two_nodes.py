"""Two Slurm nodes of one machine (ARENAFLOW_SLURM_NODES=2 bash scripts/slurm-local.sh, as
.ci/run does: two slurmd in multiple-slurmd mode), through the test profile.

Multi-node training, the srun + one-torchrun-per-node path of arenaflow.train.launch with gloo
ranks:
  - a LoRA and a full arm on 2 nodes x 2 ranks end at the weights (and losses) of the same arm on
    1 node x 4 ranks: the same world and data, only where the ranks run differs;
  - a rank killed on the second node, as a node lost to preemption, fails the job (its torchrun
    fails, srun's --kill-on-bad-exit ends the first node's task); Snakemake resubmits it
    (--retries 1) and the new two-node job resumes from its checkpoint to the unbroken run's
    weights;
  - the second node of a running two-node job set DOWN (as slurmctld sets a node that stops
    answering, the same path that kills and requeues its jobs): Slurm requeues the job (the
    profile's --requeue), it runs again as the same job id on both nodes (Restarts=1) and
    resumes from its checkpoint to the unbroken run's weights.
Sharded sampling: the sampling corpus rft_r1 in 3 shards runs as 3 Slurm jobs on both nodes
(where each ran, from slurmctld's record of the job) and its merge job writes the samples of the
unsharded job byte for byte (that one run locally: the bytes do not depend on the executor).

Skipped on a one-node cluster, failed instead with ARENAFLOW_SLURM_TESTS=required. The reference
corpus sft_s1 of tests/e2e/mini.yaml is built locally first, and rft_r1's policy S1 before its
sampling.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from slurmrun import (
    CONFIGS,
    TIMEOUT,
    assert_resumed_to_the_same_weights,
    finished,
    gres_count,
    in_background,
    kill,
    output,
    require_cluster,
    rule_of,
    run_id,
    run_locally,
    slurm_jobs,
    snakemake_cmd,
    squeue,
    training_at_checkpoint,
    usable_nodes,
    workdir,
)

from arenaflow import manifest, paths

pytestmark = pytest.mark.slurm

HYPER = {
    "epochs": 20,
    "lr": 2.0e-3,
    "micro_batch_size": 2,
    "grad_accum": 1,
    "max_steps": 12,
    "checkpoint_every": 4,
}
LAYOUTS = {"1x4": {"nproc": 4}, "2x2": {"nproc": 2, "nodes": 2}}
ARMS = {  # arm -> (method, layout); each pair differs only in where its 4 ranks run
    "L14": ("lora", "1x4"),
    "L22": ("lora", "2x2"),
    "F14": ("full", "1x4"),
    "F22": ("full", "2x2"),
}


@pytest.fixture(scope="module", autouse=True)
def two_nodes():
    return require_cluster(2)


def write_arm(arms: Path, arm: str, method: str, layout: str) -> None:
    hyper = {**HYPER, "method": method, **LAYOUTS[layout]}
    (arms / f"{arm}.yaml").write_text(f"init: base\ncorpus: sft_s1\nhyper: {json.dumps(hyper)}\n")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Results with the corpus sft_s1 built (locally: it takes no GPU), and an arms directory."""
    w = workdir(tmp_path_factory.mktemp("slurm_two_nodes"))
    run_locally("corpora/sft_s1/manifest.json", results=w["results"], arms=w["arms"])
    return w


@pytest.fixture(scope="module")
def layouts(corpus):
    """The four arms of ARMS trained through Slurm in one Snakemake call."""
    root, results = corpus["root"], corpus["results"]
    for arm, (method, layout) in ARMS.items():
        write_arm(corpus["arms"], arm, method, layout)
    log = root / "snakemake_layouts.log"
    cmd = snakemake_cmd(
        *(f"runs/{a}/final" for a in ARMS),
        results=results,
        arms=corpus["arms"],
        logdir=root / "slurm_logs_layouts",
    )
    t0 = time.time()
    out = finished(in_background(cmd, log), log, TIMEOUT + 60)
    print(f"\nfour 4-rank arms on the two-node cluster: {time.time() - t0:.0f} s wall")
    jobs = {j["Comment"].split("_wildcards_")[-1]: j for j in slurm_jobs(run_id(out))}
    return {"results": results, "jobs": jobs}


def weights(run: Path) -> dict:
    from safetensors.torch import load_file

    files = sorted(run.glob("*.safetensors"))
    assert files, f"{run}: no safetensors"
    return {(f.name, k): t for f in files for k, t in load_file(f).items()}


def losses(run: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["lora", "full"])
def test_an_arm_on_two_nodes_x_two_ranks_ends_at_the_weights_of_one_node_x_four(
    layouts, two_nodes, method
):
    import torch

    results, jobs = layouts["results"], layouts["jobs"]
    one, two = ("L14", "L22") if method == "lora" else ("F14", "F22")
    j1, j2 = jobs[one], jobs[two]
    assert (j1["NumNodes"], j2["NumNodes"]) == ("1", "2"), (j1, j2)
    hosts = output("scontrol", "show", "hostnames", j2["NodeList"]).split()
    assert sorted(hosts) == two_nodes, j2["NodeList"]
    assert gres_count(j1.get("TresPerNode")) == 4 and gres_count(j2.get("TresPerNode")) == 2
    # one torchrun per node, each with its own node rank
    log = (results / f"logs/train/{two}.log").read_text()
    ranks = re.findall(r"^arenaflow\.train\.launch: .* --node_rank (\d) ", log, re.M)
    assert sorted(ranks) == ["0", "1"], log[-3000:]
    run1, run2 = results / f"runs/{one}/final", results / f"runs/{two}/final"
    for arm, run in ((one, run1), (two, run2)):
        ev = json.loads((run / "training_evidence.json").read_text())
        assert ev["world_size"] == 4 and ev["optimizer_steps"] == HYPER["max_steps"], ev
        assert ev["job_id"] == jobs[arm]["JobId"] and ev["hyperparameters"]["method"] == method
    assert losses(run2) == pytest.approx(losses(run1), abs=1e-6)
    w1, w2 = weights(run1), weights(run2)
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(
            w2[k], w1[k], atol=1e-6, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}"
        )


def rank_pids(job_id: str, node_id: str) -> list[int]:
    """The training ranks (torchrun's workers: RANK is set) of one node of a running job."""
    pids = []
    for p in Path("/proc").iterdir():
        try:
            env = dict(
                kv.split("=", 1) for kv in (p / "environ").read_text().split("\0") if "=" in kv
            )
            cmdline = (p / "cmdline").read_text()
        except (OSError, ValueError):
            continue
        if (
            env.get("SLURM_JOB_ID") == job_id
            and env.get("SLURM_NODEID") == node_id
            and "RANK" in env
            and "arenaflow.train" in cmdline
        ):
            pids.append(int(p.name))
    return pids


def test_a_rank_killed_on_one_node_fails_the_job_and_the_retry_resumes_on_two_nodes(
    corpus, layouts
):
    results, root = corpus["results"], corpus["root"]
    write_arm(corpus["arms"], "K22", "lora", "2x2")
    log = root / "snakemake_kill_rank.log"
    cmd = snakemake_cmd(
        "runs/K22/final",
        "--retries",
        "1",
        results=results,
        arms=corpus["arms"],
        logdir=root / "slurm_logs_kill_rank",
    )
    deadline = time.time() + TIMEOUT
    sm = in_background(cmd, log)
    try:
        jid = training_at_checkpoint(sm, results, "K22", log, deadline)
        pids = rank_pids(jid, "1")
        assert len(pids) == 2, f"ranks of node 1 of job {jid}: {pids}"
        os.kill(pids[-1], signal.SIGKILL)
    except BaseException:
        kill(sm)
        raise
    out = finished(sm, log, deadline - time.time())

    attempts = sorted(slurm_jobs(run_id(out)), key=lambda j: int(j["JobId"]))
    assert [(j["JobId"], j["JobState"], j["NumNodes"]) for j in attempts] == [
        (jid, "FAILED", "2"),
        (attempts[-1]["JobId"], "COMPLETED", "2"),
    ], attempts
    # the kill lands a step or more after the first checkpoint: the resume is from step 4 or 8
    assert_resumed_to_the_same_weights(
        results, "K22", attempts[1]["JobId"], {4, 8}, results / "runs/L22/final", steps=12
    )


def scontrol(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["scontrol", *args], capture_output=True, text=True, timeout=30, check=check
    )


def back_in_service(node: str, timeout: float = 60) -> None:
    """`node` usable again. ReturnToService=2 (scripts/slurm-local.sh) returns a downed node whose
    slurmd answers on its own, often before anyone asks, and Slurm then refuses `state=resume`
    as an invalid transition; a cluster without it needs the resume."""
    deadline = time.time() + timeout
    while node not in usable_nodes():
        assert time.time() < deadline, output("sinfo", "-N", "-n", node)
        scontrol("update", f"nodename={node}", "state=resume", check=False)
        time.sleep(0.5)


def slurmctld_log() -> str:
    conf = output("scontrol", "show", "config")
    return Path(re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", conf, re.M).group(1)).read_text()


def test_a_node_lost_mid_training_requeues_the_two_node_job_which_resumes_as_the_same_job(
    corpus, layouts, two_nodes
):
    """The second node of a running 2 x 2 LoRA job is set DOWN once a checkpoint exists, as a
    node lost to preemption: Slurm kills the job on both nodes and requeues it (the profile's
    slurm-requeue: --requeue), Snakemake keeps waiting on the same job id, and the job runs again
    on both nodes, resuming from its checkpoint to the unbroken 2 x 2 arm's weights.

    Unlike the one-node requeue test, Slurm's hold of the requeued job (~2 min, BeginTime) is
    waited out, not skipped: the "lost" node's slurmd lives on here and reports the old run's end
    after the requeue; started at once (StartTime=now), the job was refused its new credential
    ("Job credential revoked"), or a late report took the node out of the running job, whose
    srun then waited for it forever ("Requested nodes are busy"; Slurm 22.05)."""
    results, root = corpus["results"], corpus["root"]
    write_arm(corpus["arms"], "N22", "lora", "2x2")
    log = root / "snakemake_node_down.log"
    cmd = snakemake_cmd(
        "runs/N22/final", results=results, arms=corpus["arms"], logdir=root / "slurm_logs_node_down"
    )
    deadline = time.time() + TIMEOUT
    sm, jid, lost = in_background(cmd, log), None, None
    try:
        jid = training_at_checkpoint(sm, results, "N22", log, deadline)
        lost = output("scontrol", "show", "hostnames", squeue("-j", jid, "-o", "%N")).split()[1]
        scontrol("update", f"nodename={lost}", "state=down", "reason=preempted")
        # (a job that ended before its node went down is not requeued: Snakemake then exits)
        while squeue("-j", jid, "-o", "%T") != "PENDING" and sm.poll() is None:
            assert time.time() < deadline, f"job {jid} not requeued: {squeue('-j', jid)}"
            time.sleep(0.2)
        back_in_service(lost)
        out = finished(sm, log, deadline - time.time())
    except BaseException:
        kill(sm)
        if jid:  # a killed Snakemake leaves its job queued, holding both nodes from later tests
            subprocess.run(["scancel", jid], timeout=30, check=False)
        raise
    finally:
        if lost:
            back_in_service(lost)

    jobs = slurm_jobs(run_id(out))
    assert [(j["JobId"], j["JobState"], j["Restarts"], j["NumNodes"]) for j in jobs] == [
        (jid, "COMPLETED", "1", "2")
    ], jobs
    assert sorted(output("scontrol", "show", "hostnames", jobs[0]["NodeList"]).split()) == two_nodes
    # requeued for the node's loss, not for a failure of its own
    assert f"requeue job JobId={jid} due to failure of node {lost}" in slurmctld_log()
    assert_resumed_to_the_same_weights(
        results, "N22", jid, {4, 8}, results / "runs/L22/final", steps=12
    )


# ---- a sampling corpus in shards ---------------------------------------------------------
# rft_r1 of the embedded default (tests/e2e/mini.yaml's sizes: 24 prompts, k = 2) decoded 16
# sequences a batch: 3 batches, one for each of 3 shards. Its policy S1 is trained locally.
SHARDED = "rft_r1"
SAMPLING = {"batch_size": 16}


def gpus_per_node(nodes: list[str]) -> int:
    rows = (line.split() for line in output("sinfo", "-h", "-N", "-o", "%N %G").splitlines())
    gres = {n: int(re.search(r"gpu:(?:\w+:)?(\d+)", g).group(1)) for n, g in rows if n in nodes}
    return min(gres[n] for n in nodes)


@pytest.fixture(scope="module")
def shards(corpus, two_nodes, tmp_path_factory):
    """The corpus's samples, unsharded (locally: the bytes do not depend on the executor), then
    in 3 shard jobs and a merge through Slurm in the same results."""
    root = tmp_path_factory.mktemp("slurm_shards")
    whole_cfg, sharded_cfg = root / "whole.yaml", root / "sharded.yaml"
    whole_cfg.write_text(json.dumps({"corpora": {SHARDED: SAMPLING}}))
    sharded_cfg.write_text(json.dumps({"corpora": {SHARDED: {**SAMPLING, "shards": 3}}}))
    results, arms = corpus["results"], corpus["arms"]
    samples = results / paths.samples(SHARDED)
    run_locally(
        str(samples.relative_to(results)),
        results=results,
        arms=arms,
        configs=[*CONFIGS, str(whole_cfg)],
    )
    whole = root / "whole.jsonl"
    samples.rename(whole)
    manifest.sidecar(samples).rename(manifest.sidecar(whole))
    # A node has G GPUs; each shard job asks for G // 3 + 1 of them, so no node can run all three
    # at once (with the 4 of slurm-local.sh: two on one node, the third on the other). At gpu:1
    # each, one node has room for all three, and Slurm may well put them there.
    per_job = gpus_per_node(two_nodes) // 3 + 1
    log = root / "snakemake_shards.log"
    cmd = snakemake_cmd(
        str(samples.relative_to(results)),
        "--set-resources",
        f"sample_candidates_shard:gres=gpu:{per_job}",
        results=results,
        arms=arms,
        logdir=root / "slurm_logs",
        configs=[*CONFIGS, str(sharded_cfg)],
    )
    t0 = time.time()
    out = finished(in_background(cmd, log), log, TIMEOUT + 60)
    print(f"\n{SHARDED} in 3 shards on the two-node cluster: {time.time() - t0:.0f} s wall")
    return {"samples": samples, "whole": whole, "per_job": per_job, "jobs": slurm_jobs(run_id(out))}


def test_a_corpus_in_three_shards_lands_on_both_nodes_and_merges_to_the_unsharded_bytes(
    shards, two_nodes
):
    jobs = shards["jobs"]
    assert sorted(rule_of(j["Comment"]) for j in jobs) == [
        "merge_samples",
        *["sample_candidates_shard"] * 3,
    ], "only the shards and their merge ran: the pool and the policy were reused"
    assert all(j["JobState"] == "COMPLETED" for j in jobs), jobs
    shard_jobs = [j for j in jobs if rule_of(j["Comment"]) == "sample_candidates_shard"]
    # where each shard ran, as slurmctld records it (no slurmdbd here: sacct has no record)
    hosts = {j["JobId"]: output("scontrol", "show", "hostnames", j["NodeList"]) for j in shard_jobs}
    assert sorted(set(hosts.values())) == two_nodes, hosts
    assert all(gres_count(j.get("TresPerNode")) == shards["per_job"] for j in shard_jobs)
    merge = next(j for j in jobs if rule_of(j["Comment"]) == "merge_samples")
    assert gres_count(merge.get("TresPerNode")) == 0, merge

    samples, whole = shards["samples"], shards["whole"]
    parts = paths.shards_of(str(samples), 3)
    assert all(manifest.require_file(p, "test")["rows"] > 0 for p in parts), "a shard was empty"
    assert samples.read_bytes() == whole.read_bytes()
    merged, unsharded = (json.loads(manifest.sidecar(p).read_text()) for p in (samples, whole))
    assert {k: merged[k] for k in ("sha256", "rows", "params")} == {
        k: unsharded[k] for k in ("sha256", "rows", "params")
    }
