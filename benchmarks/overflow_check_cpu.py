"""What DeepSpeed's bf16 overflow check costs a one-rank LoRA optimizer step, on CPU.

    python benchmarks/overflow_check_cpu.py [--layers 30 --steps 20 --out results.json]

A SmolLM2-135M LoRA step on an H200 is bound by the host's kernel launches (~0.25 s a
step whatever its tokens; BENCHMARKS.md). Its profile showed DeepSpeed's ZeRO-1/2 overflow check
(`has_overflow_partitioned_grads_serial`: amax, amin, two isfinite, a logical and, a not and an
add per gradient tensor) run over all 420 LoRA tensors every step: bf16 needs no loss scaling,
so `bf16.check_grad_overflow` is off in train/dist.py and `check_finite()` stops a diverged run
instead. This builds SmolLM2-135M's shape (random weights, bf16, LoRA r 64 on all seven
projections, ZeRO stage 2 on one gloo rank, as `zero_stage: auto` runs it), takes one backward,
then times `engine.step()` (the optimizer step, where the check runs) with the check on and off,
alternating, and counts the operators each step dispatches (torch.profiler): on a GPU each is at
least one kernel launch. The CPU times are host time including the arithmetic; the operator
count is what carries over to a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from gpu_bench import LORA  # sibling scripts
from zero_stage_cpu import SHAPES

from arenaflow.train.dist import ensure_dist_env

SMOLLM2 = SHAPES["smollm2"]


def smollm2_lora(layers: int, lora=None):
    """SmolLM2-135M's shape `layers` deep, random weights (seed 0), PEFT LoRA r 64 on all seven
    projections (gpu_bench.LORA; `lora`, a LoraConfig, in its place), float32 on CPU."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    net = LlamaForCausalLM(LlamaConfig(**{**SMOLLM2, "num_hidden_layers": layers}))
    if lora is None:
        lora = LoraConfig(
            r=LORA["r"], lora_alpha=LORA["alpha"], target_modules=LORA["target_modules"]
        )
    return get_peft_model(net, lora)


def build_engine(layers: int, check: bool):
    import deepspeed

    net = smollm2_lora(layers)
    params = [p for p in net.parameters() if p.requires_grad]
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2},
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": True, "check_grad_overflow": check},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(
        model=net, optimizer=torch.optim.AdamW(params, lr=1e-4), config=config
    )
    return engine, len(params)


def backward(engine, ids: torch.Tensor) -> None:
    engine.backward(engine(input_ids=ids, labels=ids).loss)


def time_steps(engine, ids: torch.Tensor, steps: int) -> list[float]:
    """Seconds of each engine.step() after a backward (the backward is not timed)."""
    out = []
    for _ in range(steps):
        backward(engine, ids)
        t = time.perf_counter()
        engine.step()
        out.append(time.perf_counter() - t)
    return out


def count_ops(engine, ids: torch.Tensor) -> dict:
    """Operators dispatched by one engine.step(): all aten calls, and the leaves among them
    (no aten call inside), which on a GPU are the kernel launches and copies."""
    from torch.profiler import ProfilerActivity, profile

    backward(engine, ids)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.step()
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    leaves = [e for e in aten if not any(c.name.startswith("aten::") for c in e.cpu_children)]
    return {"aten": len(aten), "leaf": len(leaves)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out")
    args = ap.parse_args()
    ensure_dist_env()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    torch.set_num_threads(1)
    ids = torch.randint(0, SMOLLM2["vocab_size"], (1, 32))
    engines = {check: build_engine(args.layers, check) for check in (True, False)}
    n_tensors = engines[True][1]
    times = {True: [], False: []}
    for _ in range(2):  # alternate, so drift in the machine's load hits both
        for check, (engine, _) in engines.items():
            times[check] += time_steps(engine, ids, args.steps // 2)
    ops = {check: count_ops(engine, ids) for check, (engine, _) in engines.items()}
    med = {check: statistics.median(t) for check, t in times.items()}
    result = {
        "layers": args.layers,
        "lora_tensors": n_tensors,
        "steps_each": args.steps,
        "step_ms_median": {"check on": med[True] * 1e3, "check off": med[False] * 1e3},
        "ops_per_step": {"check on": ops[True], "check off": ops[False]},
        "leaf_ops_removed_per_tensor": (ops[True]["leaf"] - ops[False]["leaf"]) / n_tensors,
        "step_time_ratio_on_over_off": med[True] / med[False],
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
