"""Host time of a one-rank LoRA step by ZeRO set-up, on CPU: stage 3, stage 3 keeping every
parameter gathered, and stage 0 (and optionally 1/2), on a small random Llama and SmolLM2-135M's
shape.

    python benchmarks/zero_stage_cpu.py [--models tiny,smollm2 --steps 10 --repeats 2
                                         --stages 0 --out results.json]

On one H200 a SmolLM2-135M LoRA step is host-bound (self CPU 543 ms, self CUDA
111 ms; BENCHMARKS.md), and ZeRO-3's module hooks are ~100 ms of it, though a job of one rank
partitions nothing. This times the same `python -m arenaflow.train` run (zero3_hooks_cpu.py's)
with (a) stage 3 as it was the default (leaf modules auto, fused LoRA, the schema's persistence
threshold), (b) stage 3 with a persistence threshold above every parameter's size (nothing
partitioned, the hooks still run), (c) ZeRO stage 0 (DeepSpeed's plain data-parallel engine),
each arm `--repeats` times in alternation, and prints the best step times, their ratios to (a)
and the largest difference of each arm's per-step losses from (a)'s.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from zero3_hooks_cpu import build, run

from arenaflow.schema import hyper_defaults

# LlamaConfig of HuggingFaceTB/SmolLM2-135M (its config.json), random weights: the host cost
# depends on the module count and shapes, not on the values.
SHAPES = {
    "tiny": {},  # 8 layers x 256 hidden, zero3_hooks_cpu.py's
    "smollm2": {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "tie_word_embeddings": True,
        "rope_theta": 100000.0,
    },
}


def arms(stages: list[int]) -> dict[str, dict]:
    """Hyper overrides of each compared set-up; (a) first."""
    default = hyper_defaults()["zero3_persistence_threshold"]
    out = {
        "a stage 3": {"zero_stage": 3, "zero3_persistence_threshold": default},
        "b stage 3, nothing partitioned": {
            "zero_stage": 3,
            "zero3_persistence_threshold": 10**12,
        },
    }
    for s in stages:
        out[f"c stage {s}"] = {"zero_stage": s}
    return out


def compare(name: str, args, root: Path) -> dict:
    """Every arm `repeats` times in alternation on model `name`: best step time, ratio to (a),
    largest per-step loss difference from (a)."""
    rows = args.steps * args.micro + 4
    model, corpus = build(root / name, 8, 256, rows, args.seq, SHAPES[name])
    setups = arms(args.stages)
    runs = {k: [] for k in setups}
    i = 0
    for _ in range(args.repeats):
        for label, extra in setups.items():
            runs[label].append(run(root / name, model, corpus, extra, args, i))
            i += 1
    ref = runs["a stage 3"][0]
    out = {}
    for label, rs in runs.items():
        best = min(r["step_s"] for r in rs)
        diff = max(abs(x - y) for r in rs for x, y in zip(r["losses"], ref["losses"]))
        out[label] = {"best_step_s": best, "max_loss_diff_vs_a": diff, "runs": rs}
    base = out["a stage 3"]["best_step_s"]
    for label, o in out.items():
        o["speedup_vs_a"] = base / o["best_step_s"]
        print(
            f"{name:8s} {label:32s} best {o['best_step_s'] * 1e3:8.1f} ms/step  "
            f"x{o['speedup_vs_a']:.2f} vs (a)  losses max |diff| vs (a) "
            f"{o['max_loss_diff_vs_a']:.1e}",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2", help=f"of {sorted(SHAPES)}")
    ap.add_argument("--stages", default="0", help="cheap stages compared, e.g. 0,1,2")
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="optional JSON results")
    args = ap.parse_args()
    args.stages = [int(s) for s in args.stages.split(",")]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            results[name] = compare(name, args, Path(tmp))
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "models": results}, indent=2))


if __name__ == "__main__":
    main()
