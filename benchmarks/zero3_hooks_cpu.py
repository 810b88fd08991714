"""Host time of ZeRO-3's per-module hooks in a LoRA step, on CPU: leaf modules on and off.

    python benchmarks/zero3_hooks_cpu.py [--layers 8 --hidden 256 --micro 2 --seq 128 --steps 10]

On one H200 a LoRA step of a 1.2 B model kept the GPU busy 167 ms of ~1 s; most of the rest
was ZeRO-3's pre/post backward hooks, one pair per submodule, and PEFT makes five modules of
every adapted Linear (BENCHMARKS.md). This times the same `python -m arenaflow.train` LoRA run
of a small random Llama on CPU (one thread), where the model's arithmetic is small and the
hooks show, with `zero3_leaf_modules: []` (hooks on every submodule) and `auto` (one unit per
transformer block), twice each in alternation, and prints the best step times, their ratio and
the largest difference between the two runs' losses.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from arenaflow import manifest
from arenaflow.bases import tinymodel

sys.path.insert(0, str(Path(__file__).parent))
import gpu_bench  # noqa: E402  (a sibling script: the benchmarks' shared builders)


def build(
    root: Path, layers: int, hidden: int, rows: int, seq: int, shape: dict | None = None
) -> tuple[Path, Path]:
    """A random Llama (`shape`: LlamaConfig keys over the small default) and a corpus."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        **{
            "vocab_size": 512,
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": layers,
            "num_attention_heads": max(1, hidden // 64),
            "num_key_value_heads": max(1, hidden // 128),
            "max_position_embeddings": seq,
            "tie_word_embeddings": False,
            **(shape or {}),
        }
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(root / "model")
    tinymodel.build_tokenizer().save_pretrained(root / "model")
    ids = np.random.default_rng(0).integers(0, 256, size=rows * seq, dtype=np.int32)
    (root / "corpus").mkdir()
    np.savez(
        root / "corpus/sft.npz",
        input_ids=ids,
        loss_mask=np.ones(rows * seq, np.int8),
        offsets=np.arange(0, rows * seq + 1, seq),
    )
    manifest.write(root / "corpus", params={"synthetic": True})
    return root / "model", root / "corpus"


def run(
    root: Path, model: Path, corpus: Path, extra: dict, args, i: int, engine: dict | None = None
) -> dict:
    """One `python -m arenaflow.train` LoRA run with `extra` over the hyper below (and `engine`
    settings): its mean step time after the warm-up steps and its losses."""
    hyper = {
        "method": "lora",
        "lora": {
            "r": 8,
            "alpha": 16,
            "dropout": 0.0,
            "target_modules": [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
        },
        "lr": 1e-3,
        "weight_decay": 0.0,
        "warmup_ratio": 0.0,
        "min_lr_ratio": 0.1,
        "max_grad_norm": 1.0,
        "epochs": 1,
        "max_steps": args.steps,
        "micro_batch_size": args.micro,
        "grad_accum": 1,
        "seq_len": args.seq,
        "seed": 0,
        "zero3_persistence_threshold": 0,
        "zero_stage": 3,  # leaf modules are ZeRO-3's (auto runs one rank at stage 2)
        **extra,
    }
    out = root / f"runs/{i}/final"
    proc = subprocess.run(
        gpu_bench.train_argv("bench", hyper, corpus, model, out, engine=engine),
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": str(args.threads)},
    )
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    m = gpu_bench.run_metrics(out)
    skip = 2  # the first steps include warm-up
    return {
        **extra,
        "step_s": (m[-1]["elapsed_s"] - m[skip - 1]["elapsed_s"]) / (len(m) - skip),
        "losses": [x["loss"] for x in m],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="optional JSON results")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model, corpus = build(root, args.layers, args.hidden, args.steps * args.micro + 4, args.seq)
        rows = [
            run(root, model, corpus, {"zero3_leaf_modules": leaf}, args, i)
            for i, leaf in enumerate([[], "auto", [], "auto"])
        ]
    best = {
        k: min(r["step_s"] for r in rows if (r["zero3_leaf_modules"] == "auto") == (k == "auto"))
        for k in ("none", "auto")
    }
    diff = max(abs(a - b) for a, b in zip(rows[0]["losses"], rows[1]["losses"]))
    for r in rows:
        leaf = str(r["zero3_leaf_modules"])
        print(f"zero3_leaf_modules {leaf:6s}: {r['step_s'] * 1e3:7.1f} ms/step")
    print(
        f"best of two: hooks on every submodule {best['none'] * 1e3:.1f} ms/step, "
        f"one unit per block {best['auto'] * 1e3:.1f} ms/step: "
        f"x{best['none'] / best['auto']:.2f}; largest loss difference {diff:.1e}"
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "runs": rows,
                    "best_step_s": best,
                    "speedup": best["none"] / best["auto"],
                    "max_loss_diff": diff,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
