"""Where a one-rank LoRA training's start-up goes on a GPU, outside the workflow.

    python benchmarks/train_startup_gpu.py [nccl] [profile] [cudnn] [nowarm]

SmolLM2-135M's shape with random bf16 weights (zero_stage_cpu.SHAPES), gpu_bench's LoRA (r 64 on
all seven projections), ZeRO stage 2 over NCCL, one rank (what `arenaflow.train` runs for one arm
on one GPU). Prints the seconds of: the imports; `deepspeed.runtime.zero.muon.muon_optimizer`,
which `deepspeed.initialize` imports for its optimizer check and which pulls in torch._inductor;
with `nccl`, a first all_reduce (NCCL's communicator); `deepspeed.initialize` itself, with a
cProfile table; and four steps of 512 x 80 tokens, then one of 512 x 72 and one of 512 x 96 (the
first one pays CUDA's lazy initialisation; with `profile`, the first two under torch.profiler, each
with its table of operators by self CPU time, to show where the first step's extra second goes).
The attention kernels are training's (arenaflow.train.model.attention_kernels: no cuDNN) unless
`cudnn` is given, which leaves PyTorch's own choice, cuDNN's attention on Hopper: run both to see
what that choice costs a first step. The CUDA warm-up of `arenaflow.train.speed.cuda_warmup` runs
beside
the model's construction, as in a training job, unless `nowarm` is given.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import sys
import time

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
os.environ.setdefault("LOCAL_RANK", "0")


def timed(label: str, t0: float) -> None:
    print(label, round(time.time() - t0, 2), flush=True)


def main() -> None:
    t = time.time()
    import deepspeed
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    timed("imports", t)
    t = time.time()
    import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401

    timed("muon import", t)
    from gpu_bench import LORA
    from zero_stage_cpu import SHAPES

    if "cudnn" not in sys.argv[1:]:
        from arenaflow.train.model import attention_kernels

        attention_kernels()
    cfg = LlamaConfig(**SHAPES["smollm2"])
    warm = None
    if "nowarm" not in sys.argv[1:]:
        from arenaflow.train.speed import cuda_warmup

        cfg.save_pretrained("/tmp/train_startup_gpu")  # what the warm-up reads of the base
        warm = cuda_warmup.start("/tmp/train_startup_gpu")
    t = time.time()
    lora = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], target_modules=LORA["target_modules"])
    net = get_peft_model(LlamaForCausalLM(cfg).to(torch.bfloat16).cuda(), lora)
    timed("model built", t)
    if warm is not None:
        t = time.time()
        cuda_warmup.finish(warm)
        timed(f"warm-up joined (it took {warm.outcome.get('s', float('nan')):.2f} s)", t)
    t = time.time()
    deepspeed.init_distributed(dist_backend="nccl")
    timed("init_distributed", t)
    if "nccl" in sys.argv[1:]:
        t = time.time()
        x = torch.ones(1, device="cuda")
        torch.distributed.all_reduce(x)
        torch.cuda.synchronize()
        timed("first all_reduce (NCCL init)", t)
    conf = {
        "train_micro_batch_size_per_gpu": 512,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "bf16": {"enabled": True, "check_grad_overflow": False},  # as train/dist.py sets it
    }
    trainable = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    t = time.time()
    prof = cProfile.Profile()
    prof.enable()
    engine, *_ = deepspeed.initialize(model=net, optimizer=opt, config=conf)
    prof.disable()
    timed("initialize", t)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(18)
    # four steps of one shape, then two of new lengths (a length-bucketed run's next buckets)
    for i, width in enumerate((80, 80, 80, 80, 72, 96)):
        ids = torch.randint(0, cfg.vocab_size, (512, width), device="cuda")
        # `profile`: the first step (and the second, to set against it) under torch.profiler
        traced = "profile" in sys.argv[1:] and i < 2
        with (
            torch.profiler.profile(record_shapes=False) if traced else contextlib.nullcontext() as p
        ):
            torch.cuda.synchronize()
            t = time.time()
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            torch.cuda.synchronize()
        timed(f"step {i} ({width} tokens a row)", t)
        if traced:
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)


if __name__ == "__main__":
    main()
