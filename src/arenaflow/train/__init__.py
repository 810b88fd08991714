"""Train one arm: LoRA or full fine-tuning, SFT or preferences (DPO, SimPO), on DeepSpeed ZeRO
(stage 3 across ranks, 2 on one: dist.zero_stage).

    python -m arenaflow.train --arm B3 --params-json '{...}' --corpus corpora/rft_r3 \\
        --init runs/R2d/final --base-model models/tiny-arith --out runs/B3/final
    torchrun --standalone --nproc_per_node 2 -m arenaflow.train ...   # N ranks, same command

Output (written atomically by rank 0): the adapter (adapter_model.safetensors +
adapter_config.json) or full weights, training_evidence.json, metrics.jsonl, manifest.json.
The corpus manifest is verified before anything is loaded.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path


def argv(
    arm: str,
    hyper: dict,
    corpus: Path | Sequence[Path],
    base_model: Path,
    out: Path,
    init: str = "base",
    launcher: Sequence[str] | None = None,
    extra: Sequence[str] = (),
    nproc: int = 1,
    engine: dict | None = None,
) -> list[str]:
    """The command line that trains `arm` into `out`, as rules/train.smk writes it (for tests and
    benchmarks): `python -m arenaflow.train ...` for one rank, torchrun --standalone for `nproc`
    on this node (rules/common.smk's launcher), or `launcher` (a launcher's argv up to its -m)
    in place of either; `extra` adds options (--corpus-id, --mix-json, ...); `engine` the
    engine settings (arenaflow.engine; default: the schema's)."""
    if launcher is None:
        torchrun = ["torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m"]
        launcher = [sys.executable, "-m", *(torchrun if nproc > 1 else [])]
    corpora = [corpus] if isinstance(corpus, (str, Path)) else list(corpus)
    return [
        *launcher,
        "arenaflow.train",
        *("--arm", arm, "--params-json", json.dumps(hyper)),
        *(("--engine-json", json.dumps(engine)) if engine else ()),
        *("--corpus", *map(str, corpora)),
        *extra,
        *("--init", str(init), "--base-model", str(base_model), "--out", str(out)),
    ]
