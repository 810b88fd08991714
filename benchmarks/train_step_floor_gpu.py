"""How fast can a one-rank LoRA step of R2d's size be? arenaflow's DeepSpeed step,
against the same step in plain PyTorch, and that step captured as one CUDA graph.

    python benchmarks/train_step_floor_gpu.py [--rows 100 --seq 72 --steps 10]
        [--setups deepspeed,deepspeed-before,torch,torch-compiled,torch-graph,torch-graph-first]
        [--out results.json] [--warmup] [--trace DIR]
        [--setups deepspeed-job --shapes 264x99,267x73 --expandable-segments]  # a job's steps

R2d trains two steps of its whole corpus (100 rows, 7.1k tokens). On the H200 such a step takes
~0.2 s for ~0.035 s of GPU work: it is bound by the host launching ~4.4k kernels one by one
(BENCHMARKS.md, runs 12-16), so the job can meet neither 100k tokens/s nor 50 % GPU busy. This
measures what would: SmolLM2-135M's shape with random weights (zero_stage_cpu.SHAPES), LoRA r 64
on all seven projections (gpu_bench.LORA) through arenaflow's fused LoRA function, the same rows
and AdamW (lr 1e-4, clipping at 1.0) in every set-up:
- deepspeed: what `python -m arenaflow.train` runs on one rank (ZeRO stage 2, bf16 with fp32
  master weights, train/dist.deepspeed_config: no contiguous gradient bucket on one rank; norms
  through torch.rms_norm, as fused.install_native_norms routes them; the rotary embedding as
  one autograd node, train/rope; the gradient norm of train/grad_norm; one rank's identity
  all-reduce skipped, train/one_rank);
- deepspeed-job: the same with the job's loss (objective.sft_sum over the supervised tokens,
  float32 logits) in place of transformers' own;
- deepspeed-job-hf-rope: deepspeed-job with transformers' rotary embedding (14 autograd nodes a
  layer) in place of train/rope's one node, as the job ran until 2026-12-04;
- deepspeed-job-reduce: deepspeed-job with DeepSpeed's own all-reduce of one rank (the identity,
  a copy back per gradient tensor) in place of train/one_rank's skip, as until 2026-12-04;
- deepspeed-job-grouped: deepspeed-job with each layer's q/k/v and gate/up LoRA linears as one
  function each (train/lora_grouped: the job's `grouped_lora`, default off until this A/B decides);
- deepspeed-before: the same as deepspeed without those (transformers' RMSNorm, DeepSpeed's
  per-tensor gradient norm, gradients copied to a contiguous reduce bucket): arenaflow's step
  until 2026-12-03, but for the LoRA scaling (lora_fused, the same code in both);
- torch: the same arithmetic without DeepSpeed: bf16 model, fp32 master copies of the LoRA
  weights, gradients copied to them, clipped and stepped by multi-tensor (foreach / fused) ops;
- torch-compiled: that step with the model's forward and backward compiled by inductor (no
  CUDA graphs): a fraction of the kernels, each launched from generated code; the first step
  compiles (reported apart, as a job's start-up would be, cached on disk across jobs);
- torch-graph (CUDA only): the plain step, forward to weight copy-back, captured once after three
  eager steps and replayed: the floor for a long job. A two-step job like R2d cannot use it (a
  graph is recorded by a step and replayed by later ones, within one process);
- torch-graph-first (CUDA only): the plain step recorded by the first step itself and replayed
  from then on: the most a graph can do for a two-step job.
Prints per set-up the median step time, tokens/s, the GPU's share of a step (kernel time of a
profiled step over the median step), kernels a step, the first losses, and the tokens/s of the
first two steps (what a two-step job such as R2d sees, its first step's costs included). The
set-ups take the same steps: their losses agree to bf16's rounding on a GPU and to float32's on
CPU (--cpu, the test's check of this script).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import itertools
import json
import os
import pstats
import statistics
import time

import torch
from gpu_bench import LORA  # sibling scripts
from overflow_check_cpu import smollm2_lora
from transformers.models.llama import modeling_llama
from zero_stage_cpu import SHAPES

from arenaflow import fused
from arenaflow.train import model as tmodel
from arenaflow.train import objective
from arenaflow.train.dist import deepspeed_config, ensure_dist_env, expandable_segments
from arenaflow.train.speed import grad_norm, lora_fused, lora_grouped, one_rank, rope

LR, CLIP = 1e-4, 1.0
PROMPT = 20  # leading tokens of a row left out of the loss, as a chat prompt is


def build(
    layers: int,
    device: str,
    dtype: torch.dtype,
    native_norms: bool = True,
    job_rope: bool = True,
    grouped: bool = False,
):
    net = smollm2_lora(layers).to(device, dtype)
    lora_fused.fuse(net)
    if grouped:  # q/k/v and gate/up through one function each (train/lora_grouped)
        lora_grouped.group(net)
    if native_norms:
        fused.install_native_norms(net)
    if job_rope:  # as train/setup.setup_engine: the rotary embedding as one autograd node
        rope.install(net)
    else:  # transformers' own, whatever a set-up before this one installed
        modeling_llama.apply_rotary_pos_emb = getattr(
            modeling_llama, "transformers_apply_rotary_pos_emb", modeling_llama.apply_rotary_pos_emb
        )
    return net


def batch(rows: int, seq: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPES["smollm2"]["vocab_size"], (rows, seq), generator=g)
    labels = ids.clone()
    labels[:, :PROMPT] = -100
    return ids.to(device), labels.to(device)


def deepspeed_step(
    args,
    device: str,
    before: bool = False,
    job_objective: bool = False,
    job_rope: bool = True,
    skip_reduce: bool = True,
    grouped: bool = False,
):
    """arenaflow's one-rank engine (`before`: as it was until 2026-12-03; `job_rope` False:
    transformers' rotary embedding, `skip_reduce` False: DeepSpeed's identity all-reduce, each as
    until 2026-12-04); returns step() -> loss tensor."""
    import deepspeed

    cuda = device == "cuda"
    # DeepSpeed casts to bf16 where enabled
    net = build(
        args.layers,
        device,
        torch.float32,
        native_norms=not before,
        job_rope=job_rope and not before,
        grouped=grouped,
    )
    params = [p for p in net.parameters() if p.requires_grad]
    hyper = {
        "micro_batch_size": args.rows,
        "grad_accum": 1,
        "max_grad_norm": CLIP,
        "zero3_persistence_threshold": 0,
        "precision": "auto",
    }
    config = deepspeed_config(hyper, cuda, False, 2, 1)
    if before:  # DeepSpeed's default, until 2026-12-03 on one rank too
        config["zero_optimization"]["contiguous_gradients"] = True
    engine, *_ = deepspeed.initialize(
        model=net,
        optimizer=torch.optim.AdamW(params, lr=LR, fused=cuda or None),
        config=config,
    )
    if not before:
        grad_norm.install(engine.optimizer)
        if skip_reduce:
            one_rank.install(engine.optimizer)
    if cuda and not args.warmup_no_refill:  # as train/loop does
        from arenaflow.train.speed import cuda_warmup

        cuda_warmup.refill(getattr(args, "warmup_outcome", None))
    # --shapes: one micro-batch shape a step in turn, as a length-bucketed job's
    batches = [batch(rows, seq, device) for rows, seq in args.shape_list]
    calls = itertools.count()

    def step():
        if not hasattr(step, "reserved_gib") and cuda:  # what the cache holds before step 1
            step.reserved_gib = torch.cuda.memory_reserved() / 2**30
        ids, labels = batches[next(calls) % len(batches)]
        if job_objective:  # the job's loss: objective.sft_sum over the supervised tokens
            total, _ = objective.sft_sum(engine, {"input_ids": ids, "labels": labels})
            loss = total / (labels[:, 1:] != -100).sum()
        else:
            loss = engine(input_ids=ids, labels=labels, use_cache=False).loss
        engine.backward(loss)
        engine.step()
        return loss.detach()

    return step


class PlainStep:
    """One LoRA step in plain PyTorch, DeepSpeed's bf16 arithmetic: the model in bf16 (float32
    on CPU), float32 master weights that AdamW steps, copied back after each step. Every
    per-tensor operation is a multi-tensor one, so a step launches a handful of kernels for the
    optimizer, not ~10 per LoRA tensor."""

    def __init__(self, args, device: str, capturable: bool = False, compiled: bool = False):
        cuda = device == "cuda"
        self.net = build(args.layers, device, torch.bfloat16 if cuda else torch.float32)
        self.model = torch.compile(self.net) if compiled else self.net
        self.low = [p for p in self.net.parameters() if p.requires_grad]
        self.high = [p.detach().float().clone().requires_grad_() for p in self.low]
        for lo, hi in zip(self.low, self.high):  # static gradient buffers (a graph needs them)
            lo.grad, hi.grad = torch.zeros_like(lo), torch.zeros_like(hi)
        self.opt = torch.optim.AdamW(self.high, lr=LR, fused=cuda or None, capturable=capturable)
        if capturable:
            self.init_state()
        self.ids, self.labels = batch(args.rows, args.seq, device)

    def init_state(self) -> None:
        """AdamW's state as its first step would make it (zeros), made now: made by a step that
        a graph records, it would be made again, zeroed, by every replay."""
        for p in self.high:
            self.opt.state[p].update(
                step=torch.zeros((), dtype=torch.float32, device=p.device),
                exp_avg=torch.zeros_like(p),
                exp_avg_sq=torch.zeros_like(p),
            )

    def __call__(self) -> torch.Tensor:
        torch._foreach_zero_([p.grad for p in self.low])
        loss = self.model(input_ids=self.ids, labels=self.labels, use_cache=False).loss
        loss.backward()
        torch._foreach_copy_([p.grad for p in self.high], [p.grad for p in self.low])
        torch.nn.utils.clip_grad_norm_(self.high, CLIP)  # foreach where the device has it
        self.opt.step()
        with torch.no_grad():
            torch._foreach_copy_(self.low, self.high)
        return loss.detach()


def torch_step(args, device: str):
    return PlainStep(args, device)


def compiled_step(args, device: str):
    return PlainStep(args, device, compiled=True)


def graph_step(args, device: str):
    """PlainStep captured as one CUDA graph after three eager warm-up steps on a side stream
    (which train too: the captured replays continue from step 4)."""
    plain = PlainStep(args, device, capturable=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    warm = []
    with torch.cuda.stream(side):
        for _ in range(3):
            warm.append(plain())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = plain()

    def step():
        if warm:  # report the warm-up steps' losses as steps 1-3
            return warm.pop(0)
        graph.replay()
        return out

    step.ran_before = len(warm)  # steps already taken: no first-steps timing
    return step


def graph_first_step(args, device: str):
    """PlainStep recorded as a CUDA graph by the job's first step itself, no eager step before
    (a two-step job like R2d can afford no other): the first call records and replays, later
    calls replay. Measured after another set-up in the same process has loaded the kernels and
    set up cuBLAS, as a training's CUDA warm-up (train/cuda_warmup.py) does beside its model
    load."""
    plain = PlainStep(args, device, capturable=True)
    graph, out = torch.cuda.CUDAGraph(), []

    def step():
        if not out:
            with torch.cuda.graph(graph):
                out.append(plain())
        graph.replay()
        return out[0]

    return step


SETUPS = {
    "deepspeed": deepspeed_step,
    "deepspeed-job": lambda args, device: deepspeed_step(args, device, job_objective=True),
    "deepspeed-job-hf-rope": lambda args, device: deepspeed_step(
        args, device, job_objective=True, job_rope=False
    ),
    "deepspeed-job-reduce": lambda args, device: deepspeed_step(
        args, device, job_objective=True, skip_reduce=False
    ),
    "deepspeed-job-grouped": lambda args, device: deepspeed_step(
        args, device, job_objective=True, grouped=True
    ),
    "deepspeed-before": lambda args, device: deepspeed_step(args, device, before=True),
    "torch": torch_step,
    "torch-compiled": compiled_step,
    "torch-graph": graph_step,
    "torch-graph-first": graph_first_step,
}


def host_profile(pr: cProfile.Profile, path: str) -> None:
    """A step's Python profile, by own time and by time under each call, as text."""
    out = io.StringIO()
    for key in ("tottime", "cumtime"):
        pstats.Stats(pr, stream=out).sort_stats(key).print_stats(30)
    with open(path, "w") as f:
        f.write(out.getvalue())
    pr.dump_stats(path.removesuffix(".txt") + ".prof")  # for pstats: any sort, any filter


def device_trace(prof, path: str) -> dict:
    """A step's torch.profiler trace (host and device): the Chrome trace gzipped at `path`, and
    the summary that says where a first step's extra time goes: kernel count and device time,
    and the host events (operators and CUDA runtime calls: launches, allocations, module loads)
    with the most time of their own, with their count and their longest single call."""
    import gzip
    import shutil

    prof.export_chrome_trace(path)
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    os.remove(path)
    events = prof.events()
    cuda = torch.autograd.DeviceType.CUDA
    kernels = [e for e in events if e.device_type == cuda]
    host = collections.defaultdict(lambda: [0, 0.0, 0.0])  # count, self us, longest us
    for e in events:
        if e.device_type != cuda:
            h = host[e.name[:60]]
            h[0] += 1
            h[1] += e.self_cpu_time_total
            h[2] = max(h[2], e.cpu_time_total)
    top = sorted(host.items(), key=lambda kv: -kv[1][1])[:25]
    return {
        "kernels": len(kernels),
        "kernel_ms": sum(e.device_time_total for e in kernels) / 1e3,
        "host_self_ms": [(n, c, round(s / 1e3, 2), round(m / 1e3, 2)) for n, (c, s, m) in top],
    }


def measure(step, args, device: str, name: str = "") -> dict:
    """Losses, wall seconds of each step (synchronised, as a training logs every step's loss),
    and a profile of one more step: its kernels and their summed device time. With --cprofile,
    the first two steps' Python profiles too (what a first step does that later ones do not);
    with --trace, their torch.profiler traces, host and device."""
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    losses, times, traces = [], [], []
    for i in range(args.steps):
        pr = cProfile.Profile() if args.cprofile and i < 2 else None
        tr = None
        if args.trace and i < 2:
            acts = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device == "cuda")
            tr = profile(activities=acts)
            tr.__enter__()
        t = time.perf_counter()
        if pr:
            pr.enable()
        losses.append(float(step()))
        sync()
        if pr:
            pr.disable()
        times.append(time.perf_counter() - t)
        if tr:
            tr.__exit__(None, None, None)
            traces.append(device_trace(tr, f"{args.trace}/{name}-step{i + 1}.json"))
        if pr:
            host_profile(pr, f"{args.cprofile}/{name}-step{i + 1}.txt")
    median = statistics.median(times[3:] or times)  # after warm-up and the graph's capture
    row = {
        "losses": losses,
        "step_s": times,
        "median_step_s": median,
        "tokens_per_s": args.tokens_per_step / median,
    }
    if traces:
        row["traces"] = traces
    if not getattr(step, "ran_before", 0):
        # what a job of two steps (R2d) sees: its first two steps, the first's costs included
        row.update(
            two_steps_s=sum(times[:2]),
            two_step_tokens_per_s=2 * args.tokens_per_step / sum(times[:2]),
        )
    if hasattr(step, "reserved_gib"):
        row["reserved_before_first_gib"] = step.reserved_gib
    if device == "cuda":
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            sync()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        gpu_s = sum(e.device_time_total for e in kernels) / 1e6
        row.update(kernels=len(kernels), gpu_s=gpu_s, gpu_busy=gpu_s / median)
        # which kernels a step launches most: where a host-bound step's launches go
        row["top_kernels"] = collections.Counter(e.name[:80] for e in kernels).most_common(25)
        row["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return row


def before_first_step(args) -> dict:
    """What a training does between CUDA's start and its first step, timed: arenaflow's CUDA
    warm-up (--warmup: train/cuda_warmup's one-layer step, on SmolLM2's config with the step's
    LoRA, at the step's rows x tokens as a job runs it at its largest micro-batch's) and a
    reservation of --reserve-gib GiB, allocated and freed so that the caching allocator holds
    it."""
    out = {}
    if args.warmup:
        import tempfile

        from transformers import LlamaConfig

        from arenaflow.train.speed import cuda_warmup

        with tempfile.TemporaryDirectory() as base:
            LlamaConfig(**SHAPES["smollm2"]).save_pretrained(base)
            t = time.perf_counter()
            # the job's LoRA, as train/loop passes it (--warmup-plain: none, as until 2026-12-04)
            lora = None if args.warmup_plain else {**LORA, "fused": True}
            shape = (args.rows, args.seq)
            cuda_warmup.INPUT_GRADS = not args.warmup_frozen_input
            cuda_warmup.HOLD_OTHER_LAYERS = not args.warmup_no_hold
            if args.warmup_main_thread:  # is what the side thread sets up its own?
                dev = torch.device("cuda", torch.cuda.current_device())
                cuda_warmup.run(cuda_warmup.one_layer(base, dev, lora), dev, out, shape)
                args.warmup_outcome = out
            else:
                thread = cuda_warmup.start(base, shape, lora)
                args.warmup_outcome = cuda_warmup.finish(thread)
                out["held"] = args.warmup_outcome.get("held")
                out["peak"] = args.warmup_outcome.get("peak")
            out["warmup_s"] = time.perf_counter() - t
            out["reserved_gib"] = torch.cuda.memory_reserved() / 2**30
    if args.reserve_gib:
        t = time.perf_counter()
        block = torch.empty(int(args.reserve_gib * 2**30), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del block
        out["reserve_s"] = time.perf_counter() - t
    return out


def parse_args() -> argparse.Namespace:
    """The options, and the step shapes (`shape_list`) and tokens a step they make."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--seq", type=int, default=72)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--layers", type=int, default=SHAPES["smollm2"]["num_hidden_layers"])
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--cpu", action="store_true", help="on CPU, float32 (no torch-graph)")
    ap.add_argument("--out", help="results JSON")
    ap.add_argument("--warmup", action="store_true", help="run arenaflow's CUDA warm-up first")
    ap.add_argument(
        "--warmup-plain", action="store_true", help="the warm-up without the job's LoRA adapters"
    )
    ap.add_argument(
        "--warmup-frozen-input",
        action="store_true",
        help="the warm-up's layer input takes no gradient (as until 2026-12-04)",
    )
    ap.add_argument(
        "--warmup-main-thread", action="store_true", help="the warm-up on the main thread"
    )
    ap.add_argument(
        "--warmup-no-hold",
        action="store_true",
        help="the warm-up holds nothing for the other layers (as until 2026-12-04)",
    )
    ap.add_argument(
        "--warmup-no-refill",
        action="store_true",
        help="leave the cache as DeepSpeed's build leaves it, emptied (as until 2026-12-04)",
    )
    ap.add_argument(
        "--reserve-gib",
        type=float,
        default=0,
        help="allocate and free this much GPU memory first (before the engine's build, which "
        "empties the cache again: docs/benchmark-log.md, runs 43-45)",
    )
    ap.add_argument("--cprofile", metavar="DIR", help="write the first two steps' host profiles")
    ap.add_argument("--trace", metavar="DIR", help="the first two steps' torch.profiler traces")
    ap.add_argument(
        "--shapes",
        help="ROWSxSEQ,... the DeepSpeed set-up's micro-batches, a step each in turn (as a "
        "length-bucketed job's); --rows/--seq become their largest, where the warm-up runs",
    )
    ap.add_argument(
        "--expandable-segments",
        action="store_true",
        help="the allocator's expandable segments, as a training sets them",
    )
    args = ap.parse_args()
    args.shape_list = [
        tuple(int(x) for x in sh.split("x")) for sh in (args.shapes or "").split(",") if sh
    ] or [(args.rows, args.seq)]
    short = [f"{r}x{q}" for r, q in args.shape_list if q <= PROMPT]
    if short:  # every label of such a row is masked: the loss would be 0/0, NaN
        ap.error(
            f"a step's rows must be longer than the {PROMPT} prompt tokens left out of the "
            f"loss; got {', '.join(short)}"
        )
    args.rows = max(r for r, _ in args.shape_list)
    args.seq = max(s for _, s in args.shape_list)
    args.tokens_per_step = statistics.mean(r * s for r, s in args.shape_list)
    return args


def main() -> None:
    args = parse_args()
    if args.expandable_segments:
        expandable_segments()
    for d in (args.cprofile, args.trace):
        if d:
            os.makedirs(d, exist_ok=True)
    device = "cpu" if args.cpu else "cuda"
    ensure_dist_env()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if args.cpu else "nccl")
    rows = {}
    if not args.cpu:
        tmodel.attention_kernels()  # as a job sets them
        rows["before_first_step"] = before_first_step(args)
        print(f"before the first step: {rows['before_first_step']}", flush=True)
    for name in args.setups.split(","):
        try:
            rows[name] = measure(SETUPS[name](args, device), args, device, name)
        except Exception as e:  # a set-up that cannot run here is a result, not the end
            rows[name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        r = rows[name]
        if "error" in r:
            print(f"{name:14s} failed: {r['error']}", flush=True)
            continue
        busy = f", GPU busy {r['gpu_busy']:.0%}, {r['kernels']:,} kernels" if "gpu_s" in r else ""
        if "reserved_before_first_gib" in r:
            busy += f", {r['reserved_before_first_gib']:.1f} GiB cached before step 1"
        two = (
            f", two steps {r['two_step_tokens_per_s']:,.0f} tokens/s" if "two_steps_s" in r else ""
        )
        print(
            f"{name:14s} {r['median_step_s'] * 1e3:8.1f} ms a step = {r['tokens_per_s']:10,.0f} "
            f"tokens/s{busy}; first step {r['step_s'][0]:.2f} s{two}; losses "
            + ", ".join(f"{x:.5f}" for x in r["losses"][:4]),
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "device": device, "setups": rows}, f, indent=2)


if __name__ == "__main__":
    main()
