"""Multi-node training under Slurm: one torchrun per node, rendezvous from the Slurm environment.

For an arm with `nodes: N > 1` (rules/train.smk) the job holds N nodes with `--gres gpu:K` each,
and its script runs, on the first node,

    srun --nodes N --ntasks-per-node 1 --kill-on-bad-exit=1 \\
        python -m arenaflow.train.launch --nproc-per-node K -m arenaflow.train --arm ... --out ...

Every srun task (one per node) replaces itself with

    python -m torch.distributed.run --nnodes $SLURM_NNODES --node_rank $SLURM_NODEID \\
        --nproc_per_node K --rdzv_backend c10d --rdzv_id $SLURM_JOB_ID \\
        --rdzv_endpoint <first host of SLURM_JOB_NODELIST>:<port> -m arenaflow.train ...

so the N x K ranks meet at the first node's c10d store; the port is ARENAFLOW_RDZV_PORT or
29500 + SLURM_JOB_ID mod 1000 (two jobs sharing a first node do not collide).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from arenaflow import knobs

PORT_ENV = knobs.RDZV_PORT


def expand_hostlist(nodelist: str) -> list[str]:
    """Slurm's compressed host list, expanded: 'gpu[01-03,07],login1' -> gpu01 gpu02 gpu03 gpu07
    login1. Slurm's own `scontrol show hostnames` does it wherever scontrol works (as on every
    Slurm node); parse_hostlist where it is not on PATH, or where it fails: scontrol refuses
    even this string operation without a cluster configuration (a laptop with Slurm's client
    installed, a cluster stopped)."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return parse_hostlist(nodelist)
    res = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True)
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or ["no message"])[-1]
        print(
            f"arenaflow.train.launch: scontrol show hostnames failed ({why}); "
            "expanding the host list without it",
            file=sys.stderr,
        )
        return parse_hostlist(nodelist)
    return res.stdout.split()


def parse_hostlist(nodelist: str) -> list[str]:
    """The fallback without scontrol: zero padding kept; several bracket groups in one name are
    expanded left to right."""
    hosts, depth, cur = [], 0, ""
    for ch in nodelist + ",":  # split at top-level commas only
        if ch == "," and depth == 0:
            if cur:
                hosts.extend(_expand_one(cur))
            cur = ""
            continue
        depth += (ch == "[") - (ch == "]")
        cur += ch
    return hosts


def _expand_one(name: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", name)
    if not m:
        return [name]
    head, tail, out = name[: m.start()], name[m.end() :], []
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        if hi:
            width = len(lo)
            out += [f"{head}{i:0{width}d}" for i in range(int(lo), int(hi) + 1)]
        else:
            out.append(f"{head}{lo}")
    return [h for o in out for h in _expand_one(o + tail)]


def torchrun_argv(env: dict, nproc_per_node: int, rest: list[str]) -> list[str]:
    """The torchrun command this node runs, from the Slurm environment of its srun task."""
    try:
        nodelist, nnodes, node_rank, job = (
            env["SLURM_JOB_NODELIST"],
            env["SLURM_NNODES"],
            env["SLURM_NODEID"],
            env["SLURM_JOB_ID"],
        )
    except KeyError as e:
        raise SystemExit(
            f"arenaflow.train.launch: {e.args[0]} is not set; run it under srun in a Slurm job"
        ) from None
    first = expand_hostlist(nodelist)[0]
    port = int(knobs.get(PORT_ENV, env) or 29500 + int(re.sub(r"\D", "", job) or 0) % 1000)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        nnodes,
        "--node_rank",
        node_rank,
        "--nproc_per_node",
        str(nproc_per_node),
        "--rdzv_backend",
        "c10d",
        "--rdzv_id",
        job,
        "--rdzv_endpoint",
        f"{first}:{port}",
        *rest,
    ]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "--nproc-per-node":
        raise SystemExit(
            "usage: python -m arenaflow.train.launch --nproc-per-node K [--] -m module args..."
        )
    nproc, rest = int(argv[1]), argv[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    cmd = torchrun_argv(dict(os.environ), nproc, rest)
    print("arenaflow.train.launch:", " ".join(cmd), file=sys.stderr, flush=True)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
