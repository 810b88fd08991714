"""GPU benchmark of arenaflow's own training and generation paths against the device's limits.

    python benchmarks/gpu_bench.py --out bench.json [--parts ceilings,train,generate]
        [--train method=lora,micro=4 method=full,micro=16,persist=1e12 ...]
        [--layers 24 --hidden 2048]

Builds a Llama-shaped model with random bf16 weights (throughput does not depend on weight
values; 24 x 2048 is 1.2 B parameters) and synthetic corpora with sha256 manifests, then
measures, in one run:
- ceilings: device-to-device copy bandwidth and a bf16 8192^3 matmul;
- training tokens/s through `python -m arenaflow.train` (DeepSpeed ZeRO, NCCL, 1 GPU), one
  run per --train spec (keys: method lora|full, micro rows per micro-batch, persist the ZeRO-3
  persistence threshold, corpus fixed|mixed row lengths, bucket 1|0 length bucketing, leaf
  auto|none|Class+Class: ZeRO-3 leaf modules, fuse 1|0 fused LoRA linears, ew 1|0 fused norm
  and SwiGLU kernels, stage auto|2|3: zero_stage, auto being stage 2 on this one GPU).
  MFU = model FLOPs per token x tokens/s / matmul peak, with model FLOPs per token 6 N (full)
  or 4 N (LoRA: no weight gradients) over the N weights that multiply (all but the input
  embedding), plus 12 x layers x hidden x seq for attention (the PaLM convention);
- generation tokens/s through arenaflow.decode.sampling.generate at batch sizes 1..256 on each
  --gen-paths entry (GEN_PATHS: generate() with its dynamic or static cache, arenaflow's
  static engine with the compiled Llama step or with transformers' modelling code), each timed
  on its second identical call (the first pays allocation, and compilation or graph capture),
  against the bandwidth bound: batch x copy bandwidth / (weight bytes + the KV-cache bytes read
  per decode step); for the static engine also its step time and kernels per step, and at
  --equal-batches whether its greedy token ids equal generate()'s on ragged prompts.
  benchmarks/decode_check.py is a short run of the generation part alone (one device call).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import functools
import json
import pstats
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from arenaflow import chat, manifest, models
from arenaflow import engine as afengine
from arenaflow import train as train_cli
from arenaflow.bases import tinymodel
from arenaflow.decode import sampling
from arenaflow.decode import static as decode

TRAIN_DEFAULT = [
    "method=lora,micro=16",
    "method=full,micro=16",
]  # the H200 headline runs (BENCHMARKS.md)


def run_header(args) -> dict:
    """What every GPU benchmark's JSON starts with: device, torch, arguments, code, ceilings."""
    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "args": vars(args),
        "code": manifest.code_version(),
        "ceilings": ceilings(),
    }


def ceilings() -> dict:
    x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")

    def timed(fn, n=10):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n

    copy_bw = 2 * x.numel() / timed(lambda: y.copy_(x))  # bytes read + written
    flops = 2 * 8192**3 / timed(lambda: a @ a)
    return {"copy_bytes_per_s": copy_bw, "bf16_matmul_flops": flops}


def build_model(root: Path, layers: int, hidden: int, device: str = "cuda") -> tuple[Path, dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    out = root / f"model-{layers}x{hidden}"
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75),
        num_hidden_layers=layers,
        num_attention_heads=hidden // 128,
        num_key_value_heads=max(1, hidden // 512),
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    shape = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "matmul_parameters": sum(
            p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n
        ),
        "layers": layers,
        "hidden": hidden,
    }
    if not (out / "config.json").exists():
        model.save_pretrained(out)
        tinymodel.build_tokenizer().save_pretrained(out)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out, shape


def build_corpus(root: Path, rows: int, seq: int, mixed: bool) -> Path:
    """Rows of exactly seq tokens, or (mixed) of lognormal lengths around seq/5, as chat
    corpora are: the mixed corpus is where padding and length bucketing matter."""
    out = root / f"corpus-{'mixed' if mixed else 'fixed'}-{rows}x{seq}"
    if (out / manifest.MANIFEST).exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lengths = (
        np.clip(rng.lognormal(np.log(seq / 5), 0.8, rows), 32, seq).astype(int)
        if mixed
        else np.full(rows, seq)
    )
    ids = rng.integers(0, 256, size=int(lengths.sum()), dtype=np.int32)
    mask = np.concatenate(
        [np.r_[np.zeros(n // 8, np.int8), np.ones(n - n // 8, np.int8)] for n in lengths]
    )
    np.savez(out / "sft.npz", input_ids=ids, loss_mask=mask, offsets=np.r_[0, np.cumsum(lengths)])
    manifest.write(out, params={"synthetic": True, "rows": rows, "seq": seq, "mixed": mixed})
    return out


def parse_spec(text: str) -> dict:
    spec = {
        "method": "lora",
        "micro": 4,
        "persist": 1e5,
        "corpus": "fixed",
        "bucket": 1,
        "leaf": "auto",
        "fuse": 1,
        "ew": 1,
        "stage": "auto",
    }
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in spec:
            raise SystemExit(f"--train {text!r}: unknown key {key!r} (known: {', '.join(spec)})")
        spec[key] = (
            type(spec[key])(float(value))
            if key in ("micro", "persist", "bucket", "fuse", "ew")
            else value
        )
    return spec


# LoRA r=64 on all seven projections: the H200 runs' adapter (BENCHMARKS.md)
LORA = {
    "r": 64,
    "alpha": 128,
    "dropout": 0.0,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def hyperparameters(
    method: str, micro: int, accum: int, steps: int, seq: int, lr: float, **extra
) -> dict:
    """An arm's training settings: LoRA r=64 on all seven projections (or full FT), no warmup.
    The fused kernels are on (`extra` may turn them off): these runs time the steady steps, after
    the compile, which the default `auto` skips in runs this short."""
    return {
        "fused_kernels": True,
        "method": method,
        "lora": copy.deepcopy(LORA),
        "lr": lr,
        "weight_decay": 0.0,
        "warmup_ratio": 0.0,
        "min_lr_ratio": 0.1,
        "max_grad_norm": 1.0,
        "epochs": 1,
        "max_steps": steps,
        "micro_batch_size": micro,
        "grad_accum": accum,
        "seq_len": seq,
        "seed": 0,
        "zero3_persistence_threshold": 100000,
        **extra,
    }


def train_argv(
    name: str, hyper: dict, corpus: Path, model: Path, out: Path, launcher=None, engine=None
):
    """The command that trains arm `name` from the base `model` on `corpus` into `out`:
    `python -m arenaflow.train ...`, or `launcher` (e.g. torchrun's argv up to its -m) instead
    of `python -m`; `engine`: its engine settings (arenaflow.engine)."""
    return train_cli.argv(name, hyper, corpus, model, out, launcher=launcher, engine=engine)


def run_metrics(out: Path) -> list[dict]:
    """A finished run's metrics.jsonl, a dict per step."""
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def timed_rate(metrics: list[dict], skip: int = 3) -> tuple[float, float]:
    """(tokens/s, s/step) over the steps after the first `skip` (allocator and kernel warm-up)."""
    tok = metrics[-1]["tokens_seen"] - metrics[skip - 1]["tokens_seen"]
    dt = metrics[-1]["elapsed_s"] - metrics[skip - 1]["elapsed_s"]
    return tok / dt, dt / (len(metrics) - skip)


def train(
    root: Path, model: Path, spec: dict, steps: int, seq: int, flops_per_token: float, peak: float
) -> dict:
    rows = steps * spec["micro"] + 8
    if spec["corpus"] == "mixed":
        rows *= seq // 300 + 1  # the same number of steps holds fewer tokens per row
    corpus = build_corpus(root, rows, seq, spec["corpus"] == "mixed")
    hyper = hyperparameters(
        spec["method"],
        spec["micro"],
        4 if spec["corpus"] == "mixed" else 1,  # mixed: micro-batches to bucket
        steps,
        seq,
        1e-5,
        zero3_persistence_threshold=int(spec["persist"]),
        length_bucketing=bool(spec["bucket"]),
        zero3_leaf_modules="auto"
        if spec["leaf"] == "auto"
        else [c for c in spec["leaf"].split("+") if c != "none"],
        fused_lora=bool(spec["fuse"]),
        fused_kernels=bool(spec["ew"]),
        zero_stage=spec["stage"] if spec["stage"] == "auto" else int(spec["stage"]),
    )
    name = "-".join(f"{k}{v}" for k, v in spec.items())
    out = root / f"runs/{name}/final"
    t = time.time()
    argv = train_argv(name, hyper, corpus, model, out)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        return {"spec": spec, "error": proc.stderr[-3000:]}
    m = run_metrics(out)
    ev = json.loads((out / "training_evidence.json").read_text())
    rate, step_s = timed_rate(m)
    return {
        "spec": spec,
        "tokens_per_s": rate,
        "step_s": step_s,
        "steps_timed": len(m) - 3,
        "mfu": flops_per_token * rate / peak,
        "wall_s": time.time() - t,
        "peak_gpu_mem_gib": ev.get("peak_gpu_mem_gib"),
        "final_loss": m[-1]["loss"],
    }


def flops_per_token(shape: dict, method: str, seq: int) -> float:
    return (6 if method == "full" else 4) * shape["matmul_parameters"] + 12 * shape[
        "layers"
    ] * shape["hidden"] * seq


def decode_step(model, tok, prompt: str, dec, bs: int, count_kernels: bool = True) -> dict:
    """The static engine's decode steps alone (its last run, prompt pass excluded), which step
    ran (decoder_path), and (`count_kernels`) a profile of the same step run without CUDA graphs:
    kernels per step and their summed GPU time."""
    from torch.profiler import ProfilerActivity, profile

    pad = models.pad_id(tok)  # as sampling.generate pads, so the lookup below finds its decoder
    ids = {
        k: v.to("cuda")
        for k, v in sampling.left_pad(tok, [prompt] * bs, pad, sampling.PROMPT_BUCKET).items()
    }
    shape = (*ids["input_ids"].shape, dec.max_new_tokens, dec, sampling.stop_token_ids(tok), pad)
    decoder = decode.decoder_for(model, *shape)  # the one sampling.generate just ran
    step_ms = decoder.last_decode["seconds"] / decoder.last_decode["steps"] * 1e3
    base = {  # where the call's time went: its prompt pass (a graph where it has one), its steps
        "graph_step_ms": step_ms,
        "decoder_path": decoder.path,
        "decode_s": decoder.last_decode["seconds"],
        "prompt_pass_ms": decoder.last_decode["prompt_seconds"] * 1e3,
    }
    if not count_kernels:
        return base
    eager = decode.StaticDecoder(model, *shape, graphs=False)
    eager.run(ids["input_ids"], ids["attention_mask"])  # warm-up
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        eager.run(ids["input_ids"], ids["attention_mask"])
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    steps = eager.last_decode["steps"] + 1  # + the prompt pass, whose kernels are counted too
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for e in kernels:
        by_kind[kernel_kind(e.name)] = (
            by_kind.get(kernel_kind(e.name), 0.0) + e.device_time_total / 1e3 / steps
        )
        by_name[e.name[:90]] = by_name.get(e.name[:90], 0.0) + e.device_time_total / 1e3 / steps
    return {
        **base,
        "eager_step_ms": eager.last_decode["seconds"] / eager.last_decode["steps"] * 1e3,
        "kernels_per_step": len(kernels) / steps,
        "kernel_ms_per_step": sum(e.device_time_total for e in kernels) / 1e3 / steps,
        "kernel_ms_per_step_by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "top_kernels_ms_per_step": dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:12]),
    }


def host_profile(fn, top: int = 15) -> dict:
    """Where the host's time goes in one call of `fn` (cProfile): its wall time, the functions
    with the most time of their own, and the time the profile saw at all (`profiled_ms`): of a
    155 ms decode call on the H200 its top 15 held 9.4 ms, the waits on the GPU (inside `bool()`,
    `int()`, `tolist()` of CUDA tensors) showing as no entry of their own (BENCHMARKS.md)."""
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.runcall(fn)
    wall = time.perf_counter() - t
    stats = pstats.Stats(prof).stats  # {(file, line, name): (calls, ncalls, self, cumulative, _)}
    rows = [
        {
            "function": f"{Path(f).name}:{line}({name})",
            "calls": ncalls,
            "self_ms": self_s * 1e3,
            "cum_ms": cum_s * 1e3,
        }
        for (f, line, name), (_, ncalls, self_s, cum_s, _) in stats.items()
    ]
    rows.sort(key=lambda r: -r["self_ms"])
    seen = sum(r["self_ms"] for r in rows)
    return {"wall_ms": wall * 1e3, "profiled_ms": seen, "top_self": rows[:top]}


def kernel_kind(name: str) -> str:
    """A CUDA kernel's family, from its name: matrix products, compiled (Triton) fusions, the
    rest."""
    low = name.lower()
    if any(k in low for k in ("gemm", "nvjet", "cutlass", "cublas", "gemv", "splitk")):
        return "matmul"
    if low.startswith("triton"):
        return "triton (fused)"
    for kind in ("softmax", "index", "copy", "reduce", "cat", "exponential", "argmax", "fill"):
        if kind in low:
            return kind
    return "other elementwise"


GEN_PATHS = {  # name: sampling.generate keyword arguments
    "hf": {},  # transformers' generate(), dynamic cache
    "hf-static": {"cache_implementation": "static"},  # generate() with its static cache (compiled)
    # arenaflow.decode.static, CUDA-graph steps per key-length bucket: the packed Llama step
    # compiled
    # whole ...
    "static": {"engine": "static"},
    # ... at batch 1 without arenaflow.decode.kernels' GEMVs and attention (inductor + cuBLAS) ...
    "static-cublas": {"engine": "static"},
    "static-matmul": {"engine": "static"},  # ... at batch 1 with the GEMVs, not the attention ...
    "static-flex": {"engine": "static"},  # ... its decode attention through FlexAttention ...
    # ... or transformers'' modelling code with arenaflow.fused's kernels (the path before it)
    "static-hf": {"engine": "static"},
    "static-unfused": {"engine": "static"},  # the same without arenaflow.fused (fused_decode off)
}
STEP_OF_PATH = {
    "static": "llama",
    "static-cublas": "llama",
    "static-matmul": "llama",
    "static-flex": "llama",
    "static-hf": "hf",
    "static-unfused": "hf",
}  # engine decode_step


@torch.no_grad()
def greedy_vs_generate(model, tok, bs: int, new_tokens: int, seed: int = 0) -> dict:
    """Token ids of a greedy run of the static engine against generate()'s (dynamic cache) on
    the same `bs` prompts of unequal lengths, left-padded alike: rows equal, and the mean
    fraction of generate()'s tokens matched before the first difference."""
    rng = np.random.default_rng(seed)
    prompts = [
        chat.render(
            [{"role": "user", "content": " ".join(map(str, rng.integers(0, 999, n)))}], True
        )
        for n in rng.integers(2, 40, bs)
    ]
    pad, stops = models.pad_id(tok), sampling.stop_token_ids(tok)
    enc = sampling.left_pad(tok, prompts, pad, sampling.PROMPT_BUCKET)
    ids, mask = enc["input_ids"].cuda(), enc["attention_mask"].cuda()
    dec = sampling.Decoding(max_new_tokens=new_tokens)
    decoder = decode.decoder_for(model, *ids.shape, new_tokens, dec, stops, pad)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ours = [sampling.until_stop(r, stops) for r in decoder.run(ids, mask)]
    t1 = time.perf_counter()
    ref = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        eos_token_id=stops,
        pad_token_id=pad,
        do_sample=False,
    )[:, ids.shape[1] :].tolist()
    t2 = time.perf_counter()
    ref = [sampling.until_stop(r, stops) for r in ref]
    ties = divergence_ties(model, ids, mask, ours, ref)
    prefix = [  # the share of generate()'s tokens matched before the first difference
        (min(len(a), len(b)) if (i := first_difference(a, b)) is None else i) / len(b)
        for a, b in zip(ours, ref)
    ]
    return {
        "greedy_equal": ours == ref,
        "greedy_rows_equal": sum(a == b for a, b in zip(ours, ref)),
        "greedy_rows": bs,
        "greedy_matched_fraction": float(np.mean(prefix)),
        "greedy_decoder_path": decoder.path,
        **ties,
        # the same batch's wall time, prompt pass included (ours: a decoder already compiled)
        "greedy_static_s": t1 - t0,
        "greedy_generate_s": t2 - t1,
    }


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (None if equal). Both runs keep their stop
    token, so when neither is longer the lists are equal; else they differ inside both."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def float_copy(model):
    """A float32 copy of `model`, without the decoders and packed weights arenaflow.decode.static
    keeps on it (CUDA graphs do not copy)."""
    kept = {k: model.__dict__.pop(k) for k in list(model.__dict__) if k.startswith("_arenaflow")}
    try:
        return copy.deepcopy(model).float()
    finally:
        model.__dict__.update(kept)


@torch.no_grad()
def divergence_ties(model, ids, mask, ours: list, ref: list, limit: int = 64) -> dict:
    """Whether each row where our greedy ids leave generate()'s leaves them at a tie.

    In bf16 two correct decoders can pick different arg-maxes where two logits are closer than
    their rounding: random weights make such near-flat logits common, so token equality is no
    oracle there. At the first difference, on the common prefix, the model's float32 copy
    scores both tokens; the divergence is a tie when their float32 gap is within twice the
    model's own rounding there (the largest |own - float32| logit over the vocabulary: each run
    may round either way). `greedy_unexplained_rows` > 0 means a decoder chose a token that
    rounding cannot explain. At most `limit` diverging rows are scored."""
    exact = float_copy(model)
    rows = [(r, i) for r, i in enumerate(map(first_difference, ours, ref)) if i is not None]
    ratios = []
    for r, i in rows[:limit]:
        prompt = ids[r][mask[r].bool()]
        ctx = torch.cat([prompt, torch.tensor(ref[r][:i], device=prompt.device)])[None]
        own = model(ctx).logits[0, -1].float()
        high = exact(ctx).logits[0, -1].float()
        noise = (own - high).abs().max()
        gap = (high[ours[r][i]] - high[ref[r][i]]).abs()
        if noise > 0:
            ratios.append(float(gap / (2 * noise)))
        else:  # a float32 model: only an exact tie explains a difference
            ratios.append(0.0 if gap == 0 else float("inf"))
    del exact
    return {
        "greedy_diverging_rows": len(rows),
        "greedy_scored_rows": len(ratios),
        "greedy_unexplained_rows": sum(x > 1 for x in ratios),
        # the largest float32 gap at a divergence, in units of twice the rounding (<= 1: a tie)
        "greedy_gap_over_rounding_max": max(ratios, default=0.0),
    }


@torch.no_grad()
def generation(
    model_dir: Path,
    batches: list[int],
    new_tokens: int,
    prompt_len: int,
    bw: float,
    path: str = "hf",
    equal_batches: tuple[int, ...] = (1, 256),
    profile: bool = True,
    temperature: float = 1.0,
    host: bool = False,
) -> list[dict]:
    """tokens/s per batch size on one GEN_PATHS entry; for the static engine also its decode
    step (decode_step; `profile`: kernels per step), at `equal_batches` its greedy ids against
    generate()'s (greedy_vs_generate) and (`host`) a third call under cProfile (host_profile)."""

    afengine.use(
        {
            "fused_decode": not path.endswith("-unfused"),
            "decode_step": STEP_OF_PATH.get(path, "auto"),
            # each batch's default, or the one named
            "decode_attention": (
                path.rsplit("-", 1)[1] if path.endswith(("-flex", "-matmul")) else "auto"
            ),
            "decode_kernels": "off" if path.endswith("-cublas") else "auto",
        }
    )
    model = models.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    tok = tinymodel.build_tokenizer()
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = (
        2
        * cfg.num_hidden_layers
        * cfg.num_key_value_heads
        * (cfg.hidden_size // cfg.num_attention_heads)
        * 2
    )
    prompt = chat.render([{"role": "user", "content": "x" * (prompt_len - 20)}], True)
    rows = []
    for bs in batches:
        dec = sampling.Decoding(temperature=temperature, max_new_tokens=new_tokens)
        call = functools.partial(
            sampling.generate,
            model,
            tok,
            [prompt] * bs,
            dec,
            k=1,
            seed=0,
            batch_size=bs,
            desc=f"bs{bs}",
            **GEN_PATHS[path],
        )
        times = []
        for _ in range(2):  # the first call warms up; the second is timed
            torch.cuda.synchronize()
            t = time.perf_counter()
            outs = call()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        made = sum(o[0]["n_tokens"] for o in outs)
        engine = {}
        if GEN_PATHS[path].get("engine") == "static":
            engine = decode_step(model, tok, prompt, dec, bs, profile)  # reads the timed call
            if bs in equal_batches:
                engine.update(greedy_vs_generate(model, tok, bs, new_tokens))
        if host:
            torch.cuda.synchronize()
            engine["host_profile"] = host_profile(call)
        ctx = prompt_len + new_tokens / 2  # mean context length during decoding
        bound = bs * bw / (weight_bytes + bs * ctx * kv_per_token)
        rows.append(
            {
                "batch": bs,
                "path": path,
                "tokens_per_s": made / times[1],
                "first_call_s": times[0],
                "timed_call_s": times[1],
                "step_ms": times[1] / new_tokens * 1e3,
                "bound_tokens_per_s": bound,
                "fraction_of_bound": made / times[1] / bound,
                **engine,
            }
        )
        if "graph_step_ms" in engine:  # the decode steps alone: the prompt pass is compute-bound
            rows[-1]["step_fraction_of_bound"] = bs / (engine["graph_step_ms"] / 1e3) / bound
            # the call less its decode steps: the prompt pass, tokenizing, copies, the read-back
            # (decode_step read the decoder after this timed call, the last one it ran)
            rows[-1]["outside_decode_ms"] = (times[1] - engine["decode_s"]) * 1e3
        print(json.dumps(rows[-1]), flush=True)
    del model
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON results")
    ap.add_argument("--root", default="/tmp/arenaflow-bench", help="scratch directory")
    ap.add_argument("--parts", default="train,generate")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument(
        "--train", nargs="+", default=TRAIN_DEFAULT, help="key=value,... per training run"
    )
    ap.add_argument("--gen-batches", default="1,16,64,256")
    ap.add_argument(
        "--gen-paths", default="hf,hf-static,static-hf,static", help=f"of {', '.join(GEN_PATHS)}"
    )
    ap.add_argument("--equal-batches", default="1,256", help="greedy ids checked vs generate()")
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args()
    root, parts = Path(args.root), args.parts.split(",")
    res = run_header(args)
    torch.cuda.empty_cache()  # the ceilings' 4 GiB of buffers
    c = res["ceilings"]
    model, shape = build_model(root, args.layers, args.hidden)
    res["model"] = shape
    print(
        f"device {res['device']}: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
        f"{c['bf16_matmul_flops'] / 1e12:.0f} TFLOP/s, model {shape['parameters'] / 1e9:.2f} B",
        flush=True,
    )
    res["train"] = []
    for text in args.train if "train" in parts else []:
        spec = parse_spec(text)
        r = train(
            root,
            model,
            spec,
            args.steps,
            args.seq,
            flops_per_token(shape, spec["method"], args.seq),
            c["bf16_matmul_flops"],
        )
        res["train"].append(r)
        print(json.dumps(r)[:600], flush=True)
    res["generation"] = []
    for path in args.gen_paths.split(",") if "generate" in parts else []:
        res["generation"] += generation(
            model,
            [int(b) for b in args.gen_batches.split(",")],
            args.new_tokens,
            128,
            c["copy_bytes_per_s"],
            path,
            tuple(int(b) for b in args.equal_batches.split(",")),
        )
    Path(args.out).write_text(json.dumps(res, indent=2))
    for r in res["train"]:
        s = ",".join(f"{k}={v}" for k, v in r["spec"].items())
        if "error" in r:
            print(f"train {s}: FAILED {r['error'][-800:]}")
        else:
            print(
                f"train {s:60s} {r['tokens_per_s']:9.0f} tok/s  {r['step_s']:.3f} s/step  "
                f"MFU {r['mfu']:.1%}  "
                f"peak {r['peak_gpu_mem_gib']} GiB"
            )
    for g in res["generation"]:
        print(generation_line(g))


def generation_line(g: dict) -> str:
    """One generation row in words: rate, share of the bound, and for the static engine the
    step that ran, its time and kernels, and whether its greedy ids equal generate()'s."""
    line = (
        f"generate {g['path']:14s} bs {g['batch']:4d}: {g['tokens_per_s']:9.0f} tok/s = "
        f"{g['fraction_of_bound']:.1%} of the bandwidth bound {g['bound_tokens_per_s']:.0f} "
        f"({g['step_ms']:.2f} ms/step; first call {g['first_call_s']:.1f} s)"
    )
    if "graph_step_ms" in g:
        line += f"; {g['decoder_path']}: decode step {g['graph_step_ms']:.2f} ms"
        if "step_fraction_of_bound" in g:
            line += f" = {g['step_fraction_of_bound']:.1%} of the bound"
        if "outside_decode_ms" in g:
            line += (
                f"; outside the steps {g['outside_decode_ms']:.1f} ms "
                f"(prompt pass {g['prompt_pass_ms']:.2f} ms)"
            )
    if "kernels_per_step" in g:
        line += (
            f" (no graphs {g['eager_step_ms']:.2f}), {g['kernels_per_step']:.0f} kernels = "
            f"{g['kernel_ms_per_step']:.2f} ms of GPU time per step: "
            + ", ".join(f"{k} {v:.2f}" for k, v in g["kernel_ms_per_step_by_kind"].items())
        )
    if "host_profile" in g:
        h = g["host_profile"]
        line += (
            f"; a call under cProfile {h['wall_ms']:.1f} ms ({h['profiled_ms']:.1f} ms seen), "
            "most host time in: "
        ) + ", ".join(f"{r['function']} {r['self_ms']:.2f} ms" for r in h["top_self"][:5])
    if "greedy_equal" in g:
        line += (
            f"; greedy = generate(): {g['greedy_equal']} ({g['greedy_rows_equal']}/"
            f"{g['greedy_rows']} rows, {g['greedy_matched_fraction']:.1%} of tokens matched"
        )
        if "greedy_unexplained_rows" in g:
            line += (
                f"; {g['greedy_diverging_rows']} rows diverge, "
                f"{g['greedy_unexplained_rows']} of {g['greedy_scored_rows']} scored not at a "
                f"bf16 tie (largest gap {g['greedy_gap_over_rounding_max']:.2f} x rounding)"
            )
        line += ")"
    return line


if __name__ == "__main__":
    main()
