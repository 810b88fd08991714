"""A checkpoint is resumable on every rank once `checkpoints.save` returns there.

Stop 32's CI failed on the race this guards: rank 1 exited right after saving (a simulated
preemption), the launcher killed rank 0 before it had written fingerprint.json, and the next
leg started over instead of resuming. Here two gloo ranks save, rank 0 slowed down while it
writes the file, and rank 1 looks for the file the moment its own `save` returns."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from arenaflow.train.dist import free_port

RANK = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import torch.distributed as dist
    from arenaflow import io
    from arenaflow.train import checkpoints

    class Engine:  # DeepSpeed's save ends in a barrier of all ranks; so does this one
        def save_checkpoint(self, save_dir, tag, client_state):
            if os.environ["RANK"] == "0":
                Path(save_dir, "latest").write_text(tag)
            dist.barrier()

    write_json = io.write_json
    def slow_write_json(path, obj):
        time.sleep(1.5)
        write_json(path, obj)
    io.write_json = slow_write_json

    dist.init_process_group("gloo")
    ckpt = Path(sys.argv[1])
    checkpoints.save(Engine(), ckpt, 4, [], {"lr": 1e-4}, 2, 3)
    if os.environ["RANK"] == "1":
        print("meta" if (ckpt / checkpoints.META).exists() else "no meta", flush=True)
    dist.destroy_process_group()
    """
)


def test_every_rank_returns_from_save_only_once_the_fingerprint_is_written(tmp_path, repo_root):
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env.update(WORLD_SIZE="2", PYTHONPATH=str(repo_root / "src"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(ckpt)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    assert outs[1][0].strip() == "meta"
    assert Path(ckpt / "latest").read_text() == "step_000004"
