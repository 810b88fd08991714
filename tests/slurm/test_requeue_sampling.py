"""A sampling job requeued by Slurm mid-way resumes from its finished batches (the test cluster
of scripts/slurm-local.sh, the profile of tests/slurm/profile):

    bash scripts/slurm-local.sh && python -m pytest -q tests/slurm/test_requeue_sampling.py

sample_candidates of the embedded default (tests/e2e/mini.yaml) for one more corpus, `rq`: the
base policy over a pool of its own, one prompt a batch, so that the job is still decoding when
it is requeued. It is sampled once locally (the uninterrupted reference, and the pool the Slurm
run reuses), its samples are removed, and it is sampled again through Slurm; once some batches
are written as parts (arenaflow.decode.parts), `scontrol requeue` stops the running job as a
preempting scheduler does. Slurm restarts the same job (Restarts=1) and the job continues from
its parts: its log names the batches it resumed with (the parts that the first run left) and it
decodes only the others, into the reference's bytes.

How Snakemake follows a requeued job (snakemake-executor-plugin-slurm 2.8, its
check_active_jobs): a job is failed only in one of the states BOOT_FAIL, CANCELLED, DEADLINE,
FAILED, NODE_FAIL (unless --slurm-requeue), OUT_OF_MEMORY, TIMEOUT, ERROR; REQUEUED and PENDING
are not among them, so Snakemake keeps waiting on the job id it submitted and submits nothing
new. What the profile's `slurm-requeue: true` (--slurm-requeue) adds is `sbatch --requeue`: the
job may be requeued whatever the cluster's JobRequeue default, and a NODE_FAIL is left to
Slurm's requeue instead of failing the job. A user needs no more than that profile flag.

4:07 on this 2-core VM (no GPU) at a load average of ~9, beside test_slurm.py: the local
reference 70 s, the Slurm run with its requeue 176 s, of which ~50 s is the plugin's status
back-off after the job had ended.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurmrun import (
    CONFIGS,
    REPO,
    TIMEOUT,
    finished,
    in_background,
    kill,
    require_cluster,
    rule_of,
    run_id,
    running_job,
    slurm_jobs,
    snakemake_cmd,
    squeue,
)

from arenaflow.decode import parts

pytestmark = pytest.mark.slurm

PROMPTS = 64  # one prompt a batch (k 2, batch_size 2): ~10 s of decoding on an idle 2-core VM
REQUEUE_AFTER = 3  # parts written before the job is requeued
EXTRA = {
    "pools": {
        "rq": {
            "n": PROMPTS,
            "seed": 21,
            "split": "train",
            "categories": {"add": 1, "sub": 1, "mul": 1, "two_step": 1},
        }
    },
    "corpora": {
        "rq": {
            "pool": "rq",
            "policy": "base",
            "k": 2,
            "temperature": 0.8,
            "max_new_tokens": 48,
            "seed": 5,
            "batch_size": 2,
        }
    },
}
SAMPLES = "candidates/rq/samples.jsonl"
MANIFEST = "candidates/rq/samples.manifest.json"


@pytest.fixture(scope="module", autouse=True)
def cluster():
    require_cluster(1)


def sample_locally(results: Path, arms: Path, extra: Path) -> None:
    cmd = [
        *("timeout", "-k", "30", str(TIMEOUT), sys.executable, "-m", "snakemake", SAMPLES),
        *("--cores", "2", "--configfile", *CONFIGS, str(extra)),
        *("--config", f"results_dir={results}", f"arms_dir={arms}"),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT + 90)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


def part_batches(out: Path) -> list[int]:
    found = (parts.PART.fullmatch(p.name) for p in parts.parts_dir(out).glob("part-*.jsonl"))
    return sorted(int(m[1]) for m in found if m)


def requeue_when_parts_exist(sm: subprocess.Popen, out: Path, deadline: float) -> tuple:
    """(job id, the batches whose parts exist once the requeued job is stopped)."""
    while len(part_batches(out)) < REQUEUE_AFTER and sm.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert len(part_batches(out)) >= REQUEUE_AFTER, f"no {REQUEUE_AFTER} parts under {out.parent}"
    jid = running_job("sample_candidates_wildcards_rq", deadline)
    subprocess.run(["scontrol", "requeue", jid], check=True, timeout=30)
    assert not out.exists(), "the job had ended before it was requeued"
    # PENDING once its processes are gone; Slurm then holds it ~2 min (BeginTime), which an
    # administrator's StartTime=now skips
    while squeue("-j", jid, "-o", "%T") != "PENDING" and time.time() < deadline:
        time.sleep(0.2)
    left = part_batches(out)
    subprocess.run(["scontrol", "update", f"jobid={jid}", "StartTime=now"], check=True, timeout=30)
    return jid, left


def test_a_sampling_job_requeued_by_slurm_resumes_from_its_parts_to_the_same_bytes(tmp_path):
    results, arms, logdir = tmp_path / "results", tmp_path / "arms", tmp_path / "slurm_logs"
    shutil.copytree(REPO / "config/arms", arms)
    extra = tmp_path / "rq.yaml"
    extra.write_text(json.dumps(EXTRA))
    out = results / SAMPLES
    t0 = time.time()
    sample_locally(results, arms, extra)
    t1 = time.time()
    whole = out.read_bytes()
    whole_manifest = json.loads((results / MANIFEST).read_text())
    out.unlink()
    (results / MANIFEST).unlink()

    log = tmp_path / "snakemake.log"
    cmd = snakemake_cmd(SAMPLES, results=results, arms=arms, logdir=logdir)
    cmd[cmd.index("--config") : cmd.index("--config")] = [str(extra)]  # after CONFIGS
    deadline = time.time() + TIMEOUT
    sm = in_background(cmd, log)
    try:
        jid, left = requeue_when_parts_exist(sm, out, deadline)
    except BaseException:
        kill(sm)
        raise
    sm_out = finished(sm, log, deadline - time.time())
    print(f"\nlocal reference {t1 - t0:.0f} s, requeued Slurm run {time.time() - t1:.0f} s wall")

    jobs = slurm_jobs(run_id(sm_out))
    assert [(rule_of(j["Comment"]), j["JobId"], j["JobState"], j["Restarts"]) for j in jobs] == [
        ("sample_candidates", jid, "COMPLETED", "1")
    ], jobs  # the same job, restarted once; the pool was reused, nothing resubmitted
    # the rule's log is the restarted run's: it resumed with the parts the first run left (and
    # those a dying process may have finished after the snapshot) and decoded only the others
    job_log = (results / "logs/candidates/rq.sample.log").read_text()
    m = re.search(r"resuming with (\d+) finished batch\(es\) \[([\d, ]*)\]", job_log)
    assert m, f"the restarted job did not resume from parts:\n{job_log[-3000:]}"
    resumed = [int(b) for b in m[2].split(",")]
    assert set(left) <= set(resumed) and REQUEUE_AFTER <= len(resumed) < PROMPTS, (left, resumed)
    decoded = re.findall(r"^sample: \d+/\d+ prompts x2 \|", job_log, flags=re.M)
    assert len(decoded) == PROMPTS - len(resumed), job_log[-3000:]

    assert out.read_bytes() == whole
    manifest = json.loads((results / MANIFEST).read_text())
    assert {k: v for k, v in manifest.items() if k != "created_utc"} == {
        k: v for k, v in whole_manifest.items() if k != "created_utc"
    }
    assert not parts.parts_dir(out).exists(), "the parts outlived the output"
