"""Useful tokens per second of the sampling engines: k samples of each prompt, rows that stop
at lengths drawn from a real round's, static engine as it was vs now vs generate().

    python benchmarks/useful_tokens.py --device cpu --model llama-100m --prompt-lens 128,512 \
        [--k 8 --prompts 1 --engines static-old,static,generate --out results.json]
    python benchmarks/useful_tokens.py --device cuda --dtype bfloat16 --model llama-1.2b \
        --prompts 32   # or --model smollm2-135m (its shape), or a model's directory

A useful token is one generated up to its row's stop (the stop counted), never padding after it.
Each row's length is drawn (seeded) from --lengths, a JSONL of samples with `n_tokens` (a
candidates stage's samples.jsonl), or by default from the SmolLM2 round's rft_r1 sampling
(benchmarks/results/lineage_gpu-2026-12-07-h100-merged-files.tgz, logs/candidates/
rft_r1.sample.log: 8,000 samples, 181,176 tokens, so 22.6 a row, and every 512-row batch ran
48 steps, so its longest row ~45): a log-normal of that mean whose expected maximum over 512 draws
is 45 (sigma 0.25); that log keeps no per-row lengths. The stop is planted: at its drawn length a
row's logits allow only the stop token (a logits processor for generate(), the token choice
wrapped for the static engine), so every engine decodes the same lengths and the static
engine's shrinking runs as in a real round. Prompts are random token ids of exactly each
length. Engines (ENGINES): "static-old" is StaticDecoder with share=1, shrink=False (each row
runs its prompt pass, the batch runs until its longest row ends: the loop before sharing and
shrinking); "static" shares and shrinks; "generate" is transformers' generate(); "vllm" is vLLM's
offline LLM over the same weights, each row's planted length its max_tokens (EOS ignored). On
CUDA each rate is also given as a share of the bandwidth bound (bound_tokens_per_s: every weight
and each row's KV cache read once a step, at the copy bandwidth measured in the run). Each
engine runs one untimed batch first (compiles, captures), then --repeats timed ones; ratios are
to the first engine listed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor

from arenaflow.decode import sampling, steps
from arenaflow.decode import static as decode

REPO = Path(__file__).resolve().parents[1]
# Random-weight Llama shapes (the planted stops make the weights' values irrelevant):
# (layers, hidden, heads, kv heads, intermediate, vocabulary, tied embeddings)
SHAPES = {
    "llama-100m": (12, 768, 12, 4, 2048, 32000, False),
    "llama-1.2b": (24, 2048, 16, 4, 5632, 32000, False),  # benchmarks/gpu_bench.py's 24 x 2048
    "smollm2-135m": (30, 576, 9, 3, 1536, 49152, True),  # SmolLM2-135M-Instruct's config.json
}
ROUND_MEAN, ROUND_SIGMA = 22.6, 0.25  # the default lengths (module docstring)


def load_model(name: str, device: str, dtype: torch.dtype):
    """A model by shape name, "embedded" (models/tiny-arith) or a local path."""
    if name in SHAPES:
        layers, hidden, heads, kv, inter, vocab, tied = SHAPES[name]
        cfg = LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            max_position_embeddings=4096,
            tie_word_embeddings=tied,
        )
        torch.manual_seed(0)
        with torch.device(device):
            return LlamaForCausalLM(cfg).to(dtype).eval()
    path = REPO / "models/tiny-arith" if name == "embedded" else Path(name)
    return LlamaForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def draw_lengths(rows: int, max_new: int, source: str | None, rng) -> np.ndarray:
    """Each row's length (its stop included), at most max_new."""
    if source:
        pool = [json.loads(line)["n_tokens"] for line in Path(source).read_text().splitlines()]
        drawn = rng.choice(pool, rows)
    else:
        mu = math.log(ROUND_MEAN) - ROUND_SIGMA**2 / 2
        drawn = np.rint(rng.lognormal(mu, ROUND_SIGMA, rows))
    return np.clip(drawn, 1, max_new).astype(np.int64)


class PlantedStop(LogitsProcessor):
    """generate(): row r may only choose `stop` at its new token lengths[r] - 1."""

    def __init__(self, lengths: torch.Tensor, prompt_len: int, stop: int):
        self.lengths, self.prompt_len, self.stop = lengths, prompt_len, stop

    def __call__(self, input_ids, scores):
        due = input_ids.shape[1] - self.prompt_len >= self.lengths - 1
        return torch.where(due[:, None], _only(scores, self.stop), scores)


def _only(scores: torch.Tensor, stop: int) -> torch.Tensor:
    forced = torch.full_like(scores, float("-inf"))
    forced[:, stop] = 0.0
    return forced


@contextlib.contextmanager
def planted_choice(lengths: torch.Tensor, stop: int):
    """The static engine's token choice, a row (its batch row: st["origin"], as shrinking
    moves rows) choosing only `stop` at its new token lengths[row] - 1; no host sync, so the
    choice's CUDA graph captures it."""
    choose = steps.choose

    def planted(logits, st, d, pad):
        due = st["written"] >= lengths[st["origin"]] - 1
        choose(torch.where(due[:, None], _only(logits, stop), logits), st, d, pad)

    steps.choose = planted
    try:
        yield
    finally:
        steps.choose = choose


def static_engine(share_and_shrink: bool):
    def run(model, ids, k, lengths, dec, stop):
        rows = ids.repeat_interleave(k, 0)
        kw = dict(share=k, shrink=True) if share_and_shrink else dict(share=1, shrink=False)
        key = ("useful_tokens", share_and_shrink, tuple(rows.shape), dec)
        kept = model.__dict__.setdefault("_bench_decoders", {})
        with planted_choice(lengths, stop):
            if key not in kept:
                kept[key] = decode.StaticDecoder(
                    model, *rows.shape, dec.max_new_tokens, dec, [stop], 0, **kw
                )
            return kept[key].run(rows, torch.ones_like(rows))

    return run


def generate_engine(model, ids, k, lengths, dec, stop):
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=dec.max_new_tokens,
        num_return_sequences=k,
        eos_token_id=[stop],
        pad_token_id=0,
        logits_processor=[PlantedStop(lengths, ids.shape[1], stop)],
        **dec.generate_kwargs(),
    )
    return out[:, ids.shape[1] :].tolist()


def vllm_engine(model, ids, k, lengths, dec, stop):
    """vLLM's offline LLM over the same weights (saved once to a temporary directory): each row
    one request of the same prompt (vLLM's prefix caching runs a prompt's pass once) whose
    planted length is its max_tokens, EOS ignored, so it decodes the same useful tokens."""
    from vllm import SamplingParams

    llm = _vllm_for(model)
    drawn = lengths.tolist()
    sample = {"temperature": dec.temperature, "top_p": dec.top_p, "top_k": 0}
    sample = sample if dec.temperature > 0 else {"temperature": 0.0}
    params = [
        SamplingParams(n=1, max_tokens=int(n), ignore_eos=True, detokenize=False, **sample)
        for n in drawn
    ]
    prompts = [{"prompt_token_ids": row.tolist()} for row in ids.repeat_interleave(k, 0)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    # a planted row ends on its stop, as the others' do: count it in the same way
    return [list(o.outputs[0].token_ids[:-1]) + [stop] for o in outs]


def _vllm_for(model):
    """One vLLM engine per model, over its weights saved in bf16/fp16 as they are."""
    kept = model.__dict__.get("_bench_vllm")
    if kept is None:
        import tempfile

        from vllm import LLM

        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # vllm_engine.build_llm
        where = Path(tempfile.mkdtemp(prefix="useful-tokens-vllm-"))
        model.save_pretrained(where)
        dtype = str(model.dtype).removeprefix("torch.")
        # vLLM's engine core holds its share for the whole run: at 0.5 of an 80 GB H100 the
        # static engine's 256-row, 512-token compile beside it ran out of memory
        kept = LLM(model=str(where), skip_tokenizer_init=True, dtype=dtype, seed=0,
                   gpu_memory_utilization=0.3, enable_prefix_caching=True)  # fmt: skip
        model.__dict__["_bench_vllm"] = kept
    return kept


ENGINES = {  # name -> fn(model, distinct prompt ids, k, lengths [rows], Decoding, stop id)
    "static-old": static_engine(False),
    "static": static_engine(True),
    "generate": generate_engine,
    "vllm": vllm_engine,
}


def bandwidth(dev: torch.device) -> float | None:
    """Bytes/s of a 2 GiB device-to-device copy (read + write), as the decode bound counts."""
    if dev.type != "cuda":
        return None
    x = torch.empty(2**30, dtype=torch.int16, device=dev)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    sync(dev)
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync(dev)
    return 10 * 2 * x.numel() * x.element_size() / (time.perf_counter() - t)


def bound_tokens_per_s(model, rows: int, context: float, bw: float) -> float:
    """The bandwidth bound of decoding `rows` rows at a mean context of `context` tokens: each
    step reads every weight once and each row's KV cache, and yields one token a row."""
    cfg = model.config
    size = torch.finfo(model.dtype).bits // 8
    weights = sum(p.numel() for p in model.parameters()) * size
    head = cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head * size * context
    return rows * bw / (weights + rows * kv)


def measure(args, model, prompt_len: int) -> list[dict]:
    dev = model.device
    rows = args.prompts * args.k
    dec = sampling.Decoding(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    stop = 2
    rng = np.random.default_rng(args.seed)
    batches = [
        (
            torch.tensor(rng.integers(3, model.config.vocab_size, (args.prompts, prompt_len))),
            torch.tensor(draw_lengths(rows, args.max_new_tokens, args.lengths, rng)),
        )
        for _ in range(args.repeats + 1)
    ]
    lengths = torch.zeros(rows, dtype=torch.long, device=dev)  # fixed address: graph-read
    names = args.engines.split(",")
    tally = {name: {"seconds": 0.0, "useful_tokens": 0, "planted_tokens": 0} for name in names}
    # engines interleaved batch by batch: a machine's load at one moment weighs on all of them
    for b, (ids, drawn) in enumerate(batches):
        for name in names:
            lengths.copy_(drawn)
            torch.manual_seed(args.seed + b)
            sync(dev)
            t = time.perf_counter()
            out = ENGINES[name](model, ids.to(dev), args.k, lengths, dec, stop)
            sync(dev)
            if b == 0:  # compiles and captures
                continue
            got = tally[name]
            got["seconds"] += time.perf_counter() - t
            got["useful_tokens"] += sum(len(sampling.until_stop(r, [stop])) for r in out)
            got["planted_tokens"] += int(drawn.sum())
    results = []
    bw = bandwidth(dev)
    for name, got in tally.items():
        rate = got["useful_tokens"] / got["seconds"]
        row = {"engine": name, "prompt_len": prompt_len, "rows": rows, **got, "tokens_per_s": rate}
        line = (
            f"  {name:>10}: {got['useful_tokens']} useful tokens (planted "
            f"{got['planted_tokens']}) in {got['seconds']:.2f} s: {rate:8.1f} tok/s"
        )
        if bw is not None:  # the mean context a useful token is decoded at
            mean_new = got["planted_tokens"] / max(1, rows * args.repeats)
            bound = bound_tokens_per_s(model, rows, prompt_len + mean_new / 2, bw)
            row |= {"bandwidth_bytes_per_s": bw, "bound_tokens_per_s": bound}
            line += f", {rate / bound:.1%} of the bandwidth bound ({bound:.0f} tok/s)"
        results.append(row)
        print(line, flush=True)
    return results


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    ap.add_argument("--model", default="llama-100m", help=f"{sorted(SHAPES)}, embedded or a path")
    ap.add_argument("--k", type=int, default=8, help="samples per prompt")
    ap.add_argument("--prompts", type=int, default=1, help="distinct prompts per batch")
    ap.add_argument("--prompt-lens", default="128,512", help="prompt tokens, one run each")
    ap.add_argument("--max-new-tokens", type=int, default=160, help="the round's budget")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--lengths", default=None, help="JSONL of samples with n_tokens")
    ap.add_argument("--engines", default="static-old,static,generate", help=f"of {list(ENGINES)}")
    ap.add_argument("--repeats", type=int, default=2, help="timed batches per engine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON results")
    args = ap.parse_args()
    model = load_model(args.model, args.device, getattr(torch, args.dtype))
    params = sum(p.numel() for p in model.parameters())
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    print(
        f"{args.model} ({params / 1e6:.0f} M parameters, {args.dtype}) on {args.device} "
        f"({device}), {args.prompts} prompts x k={args.k}, max_new_tokens "
        f"{args.max_new_tokens}, T={args.temperature}",
        flush=True,
    )
    results = []
    for prompt_len in map(int, args.prompt_lens.split(",")):
        print(f"prompts of {prompt_len} tokens:", flush=True)
        rows = measure(args, model, prompt_len)
        for r in rows:
            r["ratio"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
        print(
            "  ratios to "
            + rows[0]["engine"]
            + ": "
            + ", ".join(f"{r['engine']} x{r['ratio']:.2f}" for r in rows)
        )
        results += rows
    if args.out:
        record = {"args": vars(args), "parameters": params, "device": device, "rows": results}
        Path(args.out).write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
