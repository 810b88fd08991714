"""Multi-node training as far as one machine allows (arenaflow.train.launch, rules/train.smk).

Not covered here: two real hosts (NCCL across a network, srun placing one task per node). What is
covered: Slurm's host list, the torchrun command each node's task runs, the train rule's launcher
and resources for `nodes: 2`, the sbatch options the Slurm plugin makes of those resources, and a
real c10d rendezvous of two "nodes" (two launchers on this machine, node ranks 0 and 1) training
to the same weights as one node with two ranks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from dagrun import dry_run
from hypers import TINY_LORA

from arenaflow.train import argv as train_argv
from arenaflow.train import launch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "nodelist,hosts",
    [
        ("gpu07", ["gpu07"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("a[8-10],login1", ["a8", "a9", "a10", "login1"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("x[009-011],y", ["x009", "x010", "x011", "y"]),
    ],
)
def test_hostlist_expansion(nodelist, hosts):
    assert launch.expand_hostlist(nodelist) == hosts  # scontrol's, where this machine has it
    assert launch.parse_hostlist(nodelist) == hosts  # the fallback without scontrol


def test_hostlist_expansion_uses_scontrol_when_it_is_on_path(tmp_path, monkeypatch):
    fake = tmp_path / "scontrol"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\nprintf "n1\\nn2\\n"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert launch.expand_hostlist("gpu[01-03]") == [
        "n1",
        "n2",
    ]  # what scontrol said, not the parser
    assert (tmp_path / "args").read_text().split() == ["show", "hostnames", "gpu[01-03]"]


def test_a_scontrol_without_a_cluster_falls_back_to_the_parser(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "scontrol"  # what scontrol does with no slurm.conf to read
    fake.write_text(
        "#!/bin/sh\n"
        'echo "scontrol: fatal: Could not establish a configuration source" >&2\n'
        "exit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert launch.expand_hostlist("gpu[01-02],login1") == ["gpu01", "gpu02", "login1"]
    assert "Could not establish a configuration source" in capsys.readouterr().err


def test_hostlist_expansion_falls_back_to_the_parser_without_scontrol(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no scontrol
    assert launch.expand_hostlist("gpu[01-02],login1") == ["gpu01", "gpu02", "login1"]


def test_each_node_runs_torchrun_with_the_rendezvous_at_the_first_host():
    env = {
        "SLURM_JOB_NODELIST": "gpu[12-13]",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "1",
        "SLURM_JOB_ID": "5773",
    }
    cmd = launch.torchrun_argv(env, 4, ["-m", "arenaflow.train", "--arm", "B3"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    args = dict(zip(cmd[3:-4:2], cmd[4:-4:2]))
    assert args == {
        "--nnodes": "2",
        "--node_rank": "1",
        "--nproc_per_node": "4",
        "--rdzv_backend": "c10d",
        "--rdzv_id": "5773",
        "--rdzv_endpoint": "gpu12:30273",
    }  # 29500 + 5773 % 1000
    assert cmd[-4:] == ["-m", "arenaflow.train", "--arm", "B3"]
    assert launch.torchrun_argv({**env, launch.PORT_ENV: "4000"}, 4, [])[-1] == "gpu12:4000"
    with pytest.raises(SystemExit, match="SLURM_NODEID"):
        launch.torchrun_argv({k: v for k, v in env.items() if k != "SLURM_NODEID"}, 4, [])


def test_a_two_node_arm_is_one_srun_of_torchruns_and_one_task_per_node(tmp_path):
    arms = tmp_path / "arms"
    shutil.copytree(REPO / "config/arms", arms)
    (arms / "B1.yaml").write_text(
        "init: R2d\ncorpus: rft_r3\nhyper: {lr: 1.0e-3, nproc: 4, nodes: 2}\n"
    )
    cmd = dry_run(
        "-p", "runs/B1/final", "--forceall", "--cores", "1", results=tmp_path / "r", arms=arms
    )
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=330)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    block = out[out.index("wildcards: arm=B1") :]
    assert (
        "srun --nodes 2 --ntasks-per-node 1 --kill-on-bad-exit=1 python -m arenaflow.train.launch "
        "--nproc-per-node 4 -m arenaflow.train --arm B1"
    ) in block
    res = block[block.index("resources:") :].splitlines()[0]
    for kv in ("gres=gpu:4", "nodes=2", "mpi=srun", "tasks=2", "tasks_per_gpu=0"):
        assert kv in res, res
    single = out[out.index("wildcards: arm=S1") :]
    res1 = single[single.index("resources:") :].splitlines()[0]
    assert "nodes=1" in res1 and "mpi=" not in res1 and "tasks=" not in res1, res1
    assert "python -m arenaflow.train --arm S1" in single


class Resources(dict):
    def __getattr__(self, k):
        return self[k]


def sbatch_options(resources: dict, threads: int) -> str:
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = SimpleNamespace(resources=Resources(resources), threads=threads, name="train_arm")
    params = {
        "run_uuid": "u",
        "slurm_logfile": "l",
        "comment_str": "c",
        "account": "",
        "partition": "",
        "workdir": "/w",
    }
    return get_submit_command(job, params) + set_gres_string(job)


def test_the_slurm_plugin_turns_the_train_resources_into_one_task_per_node():
    base = {"mem_mb": 4000, "runtime": 30}
    one = sbatch_options({**base, "gres": "gpu:4", "nodes": 1}, threads=4)
    assert "--gres=gpu:4" in one and "--nodes=1" in one and "--cpus-per-task=4" in one
    assert "--ntasks" not in one and "--gpus" not in one  # one task (Slurm's default), no gpu=N
    two = sbatch_options(
        {**base, "gres": "gpu:4", "nodes": 2, "mpi": "srun", "tasks": 2, "tasks_per_gpu": 0},
        threads=4,
    )
    assert "--gres=gpu:4" in two and "--nodes=2" in two and "--ntasks=2" in two
    assert "--ntasks-per-gpu" not in two and "--gpus" not in two


@pytest.mark.ranks  # two gloo ranks: the ranks tier keeps the README's default tier short
def test_two_launchers_on_one_machine_rendezvous_like_two_nodes(tmp_path):
    """Two 'nodes' (node ranks 0 and 1, one rank each) meet through c10d at the first host and
    train to the same weights as one node running two ranks."""
    import torch
    from safetensors.torch import load_file

    from arenaflow.bases import tinymodel
    from arenaflow.corpora import build as corpora
    from arenaflow.pools import math as mathpool

    corpus = tmp_path / "c"
    rows = mathpool.generate(32, 5, "train", {"add": 1, "sub": 1}, "m")
    corpora.build(corpus, rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {})
    hyper = {**TINY_LORA, "lr": 1e-3, "max_steps": 3, "micro_batch_size": 4}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def train_args(out, h):  # torchrun's arguments after its own options
        base = REPO / "models/tiny-arith"
        return train_argv(out.parent.name, h, corpus, base, out, launcher=["-m"])

    two = tmp_path / "N2" / "final"
    slurm = {
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "4242",
        launch.PORT_ENV: str(29000 + os.getpid() % 1000),
    }
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "arenaflow.train.launch",
                "--nproc-per-node",
                "1",
                *train_args(two, {**hyper, "nproc": 1, "nodes": 2}),
            ],
            env={**env, **slurm, "SLURM_NODEID": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    try:
        logs = [p.communicate(timeout=600)[0] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in nodes), "\n".join(log[-3000:] for log in logs)
    one = tmp_path / "N1" / "final"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            *train_args(one, {**hyper, "nproc": 2}),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ev = json.loads((two / "training_evidence.json").read_text())
    assert ev["world_size"] == 2 and ev["optimizer_steps"] == 3
    wa, wb = (
        load_file(one / "adapter_model.safetensors"),
        load_file(two / "adapter_model.safetensors"),
    )
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-6, rtol=1e-5)
