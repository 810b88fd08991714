"""arenaflow.zygote: `python -m arenaflow.zygote run --socket S -- MODULE ARGS` (what rules run
with config `fork_server` set) runs as a fork of a server that imported the heavy modules once,
and behaves as `python -m MODULE ARGS` run on its own: the same files and output, its exit
status, its signals, and its own start-up clock."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from arenaflow import zygote

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "models/tiny-arith"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sock = tmp_path_factory.mktemp("zygote") / "af.sock"
    log = sock.with_suffix(".log")
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "arenaflow.zygote", "serve", "--socket", str(sock)]
            + [
                "--preload",
                "torch",
                "transformers:AutoModelForCausalLM",
                "arenaflow.evals.readout",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    deadline = time.time() + 120
    while "serving on" not in log.read_text() and time.time() < deadline:
        assert proc.poll() is None, log.read_text()
        time.sleep(0.2)
    yield sock, log
    proc.terminate()
    proc.wait(timeout=30)
    assert not sock.exists()  # the server removes its socket


def through(sock) -> list[str]:
    """`python -m`, run through the fork server at `sock` as rules/common.smk prefixes every
    command (zygote.command), or on its own (sock None)."""
    prefix = zygote.command(None if sock is None else str(sock)).split()
    return [*prefix, sys.executable, "-m"]


def run(args, sock=None, **kw):
    return subprocess.run([*through(sock), *args], cwd=REPO, capture_output=True, text=True, **kw)


def forks(log: Path) -> list[str]:
    return [x for x in log.read_text().splitlines() if x.startswith("arenaflow.zygote: ")][1:]


def test_a_command_gives_the_same_output_and_status_as_on_its_own(server):
    sock, log = server
    # the imports' objects frozen before any fork: a child's collections never walk them
    frozen = re.search(r"; (\d+) objects frozen", log.read_text())
    assert frozen and int(frozen.group(1)) > 100_000  # torch and transformers' modules
    before = len(forks(log))
    cmd = ["arenaflow.config", "config/config.yaml"]
    alone, forked = run(cmd), run(cmd, sock)
    assert forked.returncode == alone.returncode == 0
    assert forked.stdout == alone.stdout and "B3: init=R2d" in forked.stdout
    assert forks(log)[before:] and forks(log)[-1].endswith("arenaflow.config config/config.yaml")
    bad = run(["arenaflow.config", "/nonexistent.yaml"], sock)
    assert bad.returncode == 1 and "No such file or directory: '/nonexistent.yaml'" in bad.stderr


def test_a_readout_through_the_server_writes_the_file_a_process_of_its_own_writes(server, tmp_path):
    """Same rows (seeded sampling: the fork draws its own stream) and a start-up clock that
    starts with the client, not with the server."""
    pool = tmp_path / "pool.jsonl"
    rows = [
        {"id": f"q{i}", "category": "add", "prompt": f"{i} + 3 = ?", "gold": str(i + 3)}
        for i in range(6)
    ]
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outs = {}
    for name, sock in (("alone", None), ("forked", server[0])):
        outs[name] = tmp_path / f"{name}.parquet"
        t0 = time.time()
        proc = run(
            ["arenaflow.evals.readout", "readout", "--suite", "math", "--arm", "base", "--pool"]
            + [str(pool), "--base-model", str(TINY), "--regime-json"]
            + ['{"temperature": 0.8, "max_new_tokens": 16}', "--out", str(outs[name])],
            sock,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        loaded = float(re.search(r"model loaded ([\d.]+)s after", proc.stderr).group(1))
        assert 0 < loaded <= time.time() - t0
    pd.testing.assert_frame_equal(pd.read_parquet(outs["forked"]), pd.read_parquet(outs["alone"]))


def test_the_client_forwards_sigterm_and_a_killed_client_takes_its_job_along(server, tmp_path):
    sock, log = server
    pool = tmp_path / "pool.jsonl"
    rows = [
        {"id": f"q{i}", "category": "add", "prompt": f"{i}+{i}?", "gold": "0"} for i in range(400)
    ]
    pool.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [
        *through(sock),
        "arenaflow.evals.readout",
        "readout",
        "--suite",
        "math",
        "--arm",
        "base",
    ]
    cmd += ["--pool", str(pool), "--base-model", str(TINY), "--batch-size", "2", "--regime-json"]
    cmd += ['{"temperature": 0.8, "max_new_tokens": 48}', "--out", str(tmp_path / "x.parquet")]
    for sig, want in ((signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        n = len(forks(log))
        client = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.DEVNULL)
        while len(forks(log)) == n:
            time.sleep(0.1)
        child = int(forks(log)[-1].split(":")[1])
        time.sleep(1.0)
        client.send_signal(sig)
        assert client.wait(timeout=60) == want
        for _ in range(100):  # the child is gone (reaped by the server) soon after
            if not Path(f"/proc/{child}").exists():
                break
            time.sleep(0.1)
        assert not Path(f"/proc/{child}").exists()
    assert not (tmp_path / "x.parquet").exists()


def test_without_a_server_the_command_runs_on_its_own(tmp_path):
    proc = run(["arenaflow.config", "config/config.yaml"], tmp_path / "none.sock")
    assert proc.returncode == 0 and "B3: init=R2d" in proc.stdout
    assert "not reachable" in proc.stderr and "running here" in proc.stderr


def test_importing_arenaflow_never_delegates_or_exits(tmp_path):
    """The fork server is reached only through `arenaflow.zygote run`: a plain `python -m
    arenaflow.<module>` runs here whatever the environment holds."""
    env = {**os.environ, "ARENAFLOW_ZYGOTE": str(tmp_path / "none.sock")}
    proc = subprocess.run(
        [sys.executable, "-m", "arenaflow.config", "config/config.yaml"],
        env=env, cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0 and "B3: init=R2d" in proc.stdout
    assert "zygote" not in proc.stderr


def test_the_rules_command_prefix():
    assert zygote.command(None) == ""
    assert zygote.command("/tmp/a b.sock") == (
        "python -m arenaflow.zygote run --socket '/tmp/a b.sock' -- "
    )


@pytest.mark.parametrize(
    "argv, want",
    [
        (["python", "-m", "arenaflow.evals.readout", "x"], ["arenaflow.evals.readout", "x"]),
        (
            ["/usr/bin/python3", "-m", "arenaflow.train", "--arm", "A"],
            ["arenaflow.train", "--arm", "A"],
        ),
        (["torchrun", "--nproc_per_node", "2", "-m", "arenaflow.train"], None),  # exec'd as is
        (["python", "-m", "arenaflow.zygote", "serve"], None),  # the server itself
        (["python", "-m", "snakemake", "-n"], None),
        (["python", "-X", "importtime", "-m", "arenaflow.evals.readout"], None),  # flags: as is
    ],
)
def test_only_python_dash_m_arenaflow_commands_are_forked(argv, want):
    assert zygote.module_invocation(argv) == want


def test_leading_assignments_go_to_the_command_s_environment():
    env, rest = zygote.assignments(["OMP_NUM_THREADS=2", "A_B=x=y", "python", "-m", "m", "K=v"])
    assert env == {"OMP_NUM_THREADS": "2", "A_B": "x=y"} and rest == ["python", "-m", "m", "K=v"]


def test_another_command_is_run_as_it_is(tmp_path):
    out = tmp_path / "out.txt"
    proc = subprocess.run(
        [*zygote.command(str(tmp_path / "none.sock")).split(), "X=ran", "sh", "-c", "echo $X"],
        stdout=out.open("w"), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.returncode == 0 and out.read_text() == "ran\n" and "zygote" not in proc.stderr
