"""A fork server for a lineage's jobs on one machine: torch, transformers, peft and DeepSpeed
imported once, each job a fork of that process instead of a fresh interpreter.

    python -m arenaflow.zygote serve --socket /tmp/af.sock &     # once, on the GPU workstation
    snakemake --profile profiles/gpu-local --config fork_server=/tmp/af.sock ...

A job's Python imports cost 10-13 s of its 12-19 s start-up on an H200 host (torch 4 s,
transformers' AutoModel 8 s, which pulls in sklearn, DTensor and dynamo) while its work took
3-12 s (docs/benchmark-log.md). With config `fork_server` set, every rule's command is
prefixed with `python -m arenaflow.zygote run --socket S --` (rules/common.smk): for a
`python -m arenaflow.<module> ARGS` command the client sends its arguments, working directory,
environment and standard streams to the server, which forks a child that runs the module as
__main__ with them; the client waits and exits with the child's status, forwarding
SIGTERM/SIGINT/SIGHUP. Any other command (torchrun, srun), or any command when no server
answers, is exec'd as it is. The setting changes no output, so toggling it reruns nothing.

The server never touches the GPU (CUDA cannot be used in a child forked after the parent
initialised it): it refuses to start if its imports initialised CUDA, and asks PyTorch to
check devices through NVML. Not for Slurm jobs (each runs on its own node) or torchrun ranks.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path

PRELOAD = (
    "torch",
    "transformers",
    "transformers:AutoModelForCausalLM",
    "transformers:AutoTokenizer",
    "peft",
    "deepspeed",
    # deepspeed.initialize imports it (its optimizer check), and with it torch._inductor: 2.7-4 s
    # of every training job's start-up on the H200 (docs/benchmark-log.md, runs 7-8)
    "deepspeed.runtime.zero.muon.muon_optimizer",
    "pandas",
    "pyarrow.parquet",
    "math_verify",
    "arenaflow.train.loop",
    "arenaflow.decode.sampling",
    "arenaflow.evals.readout",
    "arenaflow.candidates",
    "arenaflow.corpora.build",
    "arenaflow.bundles.build",
)
_LEN = struct.Struct("!I")


# -- the wire: one length-prefixed JSON message each way ----------------------------------------
def _send(sock: socket.socket, msg: dict, fds: list[int] = ()) -> None:
    data = json.dumps(msg).encode()
    data = _LEN.pack(len(data)) + data
    if fds:  # the streams travel with the message's first bytes (SCM_RIGHTS)
        sent = socket.send_fds(sock, [data], list(fds))
        sock.sendall(data[sent:])
    else:
        sock.sendall(data)


def _recv(sock: socket.socket, nfds: int = 0) -> tuple[dict | None, list[int]]:
    """A message and the descriptors that came with it; (None, fds) when the peer closed."""
    if nfds:
        head, fds, _, _ = socket.recv_fds(sock, _LEN.size, nfds)
    else:
        head, fds = sock.recv(_LEN.size), []
    while head and len(head) < _LEN.size:
        more = sock.recv(_LEN.size - len(head))
        if not more:
            return None, fds
        head += more
    if len(head) < _LEN.size:
        return None, fds
    (n,) = _LEN.unpack(head)
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None, fds
        data += chunk
    return json.loads(data), fds


# -- the client: `python -m arenaflow.zygote run --socket S -- COMMAND` ---------------------------
def assignments(argv: list[str]) -> tuple[dict, list[str]]:
    """A shell command's leading VAR=value words (`OMP_NUM_THREADS=2 python ...`) and the rest."""
    env = {}
    while argv and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", argv[0]):
        key, _, value = argv[0].partition("=")
        env[key], argv = value, argv[1:]
    return env, argv


def module_invocation(argv: list[str]) -> list[str] | None:
    """[module, *args] of a command `python -m arenaflow.<module> ARGS`, else None (a
    launcher such as torchrun, or interpreter flags: run as it is)."""
    if len(argv) < 3 or Path(argv[0]).name not in ("python", "python3") or argv[1] != "-m":
        return None
    return argv[2:] if argv[2].startswith("arenaflow.") and argv[2] != __name__ else None


def run(path: str, argv: list[str]) -> None:
    """Run the command `argv` in a fork of the server at `path` and exit with its status; a
    command that is not `python -m arenaflow.<module>`, or a server that does not answer: exec
    the command as it is."""
    env, argv = assignments(argv)
    os.environ.update(env)
    invocation = module_invocation(argv)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if invocation is None:
            raise OSError("not a python -m arenaflow command")
        sock.connect(path)
    except OSError as e:
        if invocation is not None:
            print(f"arenaflow: zygote {path} not reachable ({e}); running here", file=sys.stderr)
        sys.stderr.flush()
        os.execvp(argv[0], argv)
    from arenaflow import jobclock

    request = {
        "argv": invocation,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "process_start": jobclock.PROCESS_START,
    }
    _send(sock, request, [0, 1, 2])
    reply, _ = _recv(sock)
    if reply is None:
        raise SystemExit(f"arenaflow: zygote {path} closed the connection before starting")
    child = reply["pid"]
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(child, s))
    status, _ = _recv(sock)
    raise SystemExit(127 if status is None else status["code"])


def command(fork_server: str | None) -> str:
    """The prefix of every rule's command (rules/common.smk's shell.prefix): nothing, or the
    client that runs the command through the fork server at `fork_server`."""
    if not fork_server:
        return ""
    import shlex

    return f"python -m arenaflow.zygote run --socket {shlex.quote(fork_server)} -- "


# -- the server ----------------------------------------------------------------------------------
def preload(names=PRELOAD) -> dict[str, float]:
    """Import each module (or `module:attribute`, for lazily exported names): seconds each."""
    import importlib

    took = {}
    for name in names:
        t = time.perf_counter()
        mod, _, attr = name.partition(":")
        m = importlib.import_module(mod)
        if attr:
            getattr(m, attr)
        took[name] = round(time.perf_counter() - t, 3)
    return took


def _cuda_untouched() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise SystemExit("arenaflow.zygote: the preloaded modules initialised CUDA; not serving")


def run_child(request: dict, fds: list[int]) -> int:
    """In the forked child: become the job (streams, directory, environment, clock) and run its
    module as __main__. Returns the exit status."""
    import runpy
    import warnings

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the server's handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "OMP_NUM_THREADS" in os.environ and "torch" in sys.modules:
        # OpenMP read its environment when the server imported torch: apply the job's here
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from arenaflow import jobclock

    jobclock.adopt(request["process_start"])  # start-up counts from the client's start
    sys.argv = [request["argv"][0], *request["argv"][1:]]
    # the module ran at the server's start (preloaded): as `python -m` would, it runs afresh
    warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
    try:
        runpy.run_module(request["argv"][0], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _watch(conn: socket.socket, pid: int) -> None:
    """Send the child's exit status to its client; kill the child if the client goes away."""

    def client_gone() -> None:
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    threading.Thread(target=client_gone, daemon=True).start()
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        _send(conn, {"code": code if code >= 0 else 128 - code})
    except OSError:
        pass
    conn.close()


def serve(path: str, names=PRELOAD) -> None:
    """Import `names`, then fork a child per connection at `path` until SIGTERM/SIGINT."""
    import warnings

    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # is_available() without cuInit
    took = preload(names)
    _cuda_untouched()
    # A child's first full collection walked every object the imports made (570k), writing to
    # each, so the fork's shared pages were copied: 320-360 ms of a job's start-up on 2 cores
    # (one such collection in a SmolLM2 training's set-up). Frozen, they are never collected.
    gc.collect()
    gc.freeze()
    # the forking thread is the only one that imports or logs; the watcher threads only wait
    warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    print(
        f"arenaflow.zygote: serving on {path}; preloaded {json.dumps(took)}; "
        f"{gc.get_freeze_count()} objects frozen",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            conn, _ = srv.accept()
            request, fds = _recv(conn, 3)
            if request is None or len(fds) != 3:
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                srv.close()
                conn.close()
                os._exit(run_child(request, fds))
            for fd in fds:
                os.close(fd)
            print(f"arenaflow.zygote: {pid}: {' '.join(request['argv'])[:200]}", flush=True)
            _send(conn, {"pid": pid})
            threading.Thread(target=_watch, args=(conn, pid), daemon=True).start()
    finally:
        srv.close()
        if os.path.exists(path):
            os.unlink(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="preload, then fork a child per job")
    s.add_argument("--socket", required=True, help="path of the Unix socket to listen on")
    s.add_argument(
        "--preload",
        nargs="*",
        default=list(PRELOAD),
        help="modules (or module:attribute) to import before serving",
    )
    r = sub.add_parser("run", help="run `python -m arenaflow.<module> ARGS` as a server's fork")
    r.add_argument("--socket", required=True, help="the server's Unix socket")
    r.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND (exec'd if not one)")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        serve(args.socket, args.preload)
        return
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("run: give the command after --")
    run(args.socket, command)


if __name__ == "__main__":
    main()
