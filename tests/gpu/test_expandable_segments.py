"""A training's CUDA allocator grows one segment in place (expandable segments), set after torch
is loaded, as under the fork server; a user's own allocator setting is left alone.

On CUDA (the gpu marker's cases, skipped without a GPU) a fresh process counts the allocator's
segments; the same check ran inline on the H200 (docs/benchmark-log.md, runs 19-22: one segment
of 3,080 MiB with it, 2,048 + 1,024 without). On CPU the setting that torch's allocator
configuration holds after the call is read back, in this process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from arenaflow.train import dist

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    ],
)

# a fresh process: torch loaded first, then the loop's setting, then the first allocations
PROBE = """
import torch
from arenaflow.train.dist import expandable_segments
expandable_segments()
a = torch.empty(2**28, device="cuda")
b = torch.empty(2**29, device="cuda")
print(len(torch.cuda.memory_snapshot()))
"""


def probe(device: str, monkeypatch, **env) -> str:
    """CUDA: the segments two allocations took; CPU: the allocator setting after the call."""
    clean = {k: v for k, v in os.environ.items() if not k.endswith("ALLOC_CONF")}
    if device == "cuda":
        out = subprocess.run(
            [sys.executable, "-c", PROBE],
            env={**clean, **env},
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.split()[-1]
    for k in set(os.environ) - set(clean):
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get, put = (
        torch._C._accelerator_getAllocatorSettings,
        torch._C._accelerator_setAllocatorSettings,
    )
    before = get()
    put("expandable_segments:False")  # fixed segments, torch's default, whatever ran before
    try:
        dist.expandable_segments()
        return get()
    finally:
        put(before)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_training_allocates_from_one_growing_segment(device, monkeypatch):
    assert probe(device, monkeypatch) == {"cpu": "expandable_segments:True", "cuda": "1"}[device]


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_users_allocator_setting_is_kept(device, monkeypatch):
    # the user's (here: the default, fixed segments) wins: one segment per allocation
    got = probe(device, monkeypatch, PYTORCH_ALLOC_CONF="expandable_segments:False")
    assert got == {"cpu": "expandable_segments:False", "cuda": "2"}[device]
