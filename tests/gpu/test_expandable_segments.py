"""A training's CUDA allocator grows one segment in place (expandable segments), set after torch
is loaded, as under the fork server; a user's own allocator setting is left alone.

Needs one CUDA GPU; skipped elsewhere (CI has none). The same check ran inline on the H200
(docs/benchmark-log.md, runs 19-22: one segment of 3,080 MiB with it, 2,048 + 1,024 without)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# a fresh process: torch loaded first, then the loop's setting, then the first allocations
PROBE = """
import torch
from arenaflow.train.dist import expandable_segments
expandable_segments()
a = torch.empty(2**28, device="cuda")
b = torch.empty(2**29, device="cuda")
print(len(torch.cuda.memory_snapshot()))
"""


def segments(**env) -> int:
    clean = {k: v for k, v in os.environ.items() if not k.endswith("ALLOC_CONF")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[-1])


def test_a_training_allocates_from_one_growing_segment():
    assert segments() == 1


def test_a_users_allocator_setting_is_kept():
    # the user's (here: the default, fixed segments) wins: one segment per allocation
    assert segments(PYTORCH_ALLOC_CONF="expandable_segments:False") == 2
