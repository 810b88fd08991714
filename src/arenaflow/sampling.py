"""Batched generation from a causal LM: k samples per prompt, or greedy, stopping on stop tokens.

Shared by candidate sampling, readouts, the tiny model's builder and the bundle reload check,
so every stage decodes the same way.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass

import torch

from arenaflow import decode

PROMPT_BUCKET = 32  # static engine: prompts are left-padded to a multiple of this

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decoding:
    """How to decode. temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    repetition_penalty: float = 1.0

    def generate_kwargs(self) -> dict:
        if self.temperature <= 0:
            return {"do_sample": False, "repetition_penalty": self.repetition_penalty}
        # transformers 5 applies top_k=50 by default when sampling; top_k=0 disables it.
        return {
            "do_sample": True,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": 0,
            "repetition_penalty": self.repetition_penalty,
        }


def stop_token_ids(tokenizer) -> list[int]:
    ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    ids = [i for i in ids if i is not None and i != tokenizer.unk_token_id]
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[str],
    decoding: Decoding,
    k: int = 1,
    seed: int = 0,
    batch_size: int = 64,
    desc: str = "generate",
    cache_implementation: str | None = None,
    engine: str = "hf",
) -> list[list[dict]]:
    """For each rendered prompt, `k` samples: {text, n_tokens, stopped}.

    engine "hf" decodes with transformers' generate() (`cache_implementation` goes to it);
    "static" with arenaflow.decode's static-cache loop, CUDA graphs on a GPU (the same greedy
    output; samples from the same distributions, drawn from another random stream).
    Each batch is seeded with seed + batch index, so results depend only on (seed, prompts,
    batch_size, k, engine), never on what ran before in the process.
    """
    if engine not in ("hf", "static"):
        raise ValueError(f"engine {engine!r}: expected 'hf' or 'static'")
    model.eval()
    stops = stop_token_ids(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    tokenizer.padding_side = "left"
    out: list[list[dict]] = []
    per_batch = max(1, batch_size // k)
    t0, done_tokens = time.time(), 0
    for b, start in enumerate(range(0, len(prompts), per_batch)):
        chunk = prompts[start : start + per_batch]
        # the static loop keeps one decoder (and its CUDA graphs) per padded prompt length
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False,
                        pad_to_multiple_of=PROMPT_BUCKET if engine == "static" else None)
        enc = {key: v.to(model.device) for key, v in enc.items()}
        torch.manual_seed(seed + b)
        if engine == "static":
            ids, mask = (enc[key].repeat_interleave(k, dim=0) for key in ("input_ids", "attention_mask"))
            decoder = decode.decoder_for(model, *ids.shape, decoding.max_new_tokens, decoding, stops, pad)
            new = decoder.run(ids, mask)
        else:
            gen = model.generate(
                **enc,
                max_new_tokens=decoding.max_new_tokens,
                num_return_sequences=k,
                eos_token_id=stops,
                pad_token_id=pad,
                **({"cache_implementation": cache_implementation} if cache_implementation else {}),
                **decoding.generate_kwargs(),
            )
            new = gen[:, enc["input_ids"].shape[1] :].tolist()
        for i in range(len(chunk)):
            samples = []
            for ids in new[i * k : (i + 1) * k]:
                stop_at = next((j for j, t in enumerate(ids) if t in stops), None)
                kept = ids if stop_at is None else ids[:stop_at]
                samples.append(
                    {
                        "text": tokenizer.decode(kept, skip_special_tokens=True),
                        "n_tokens": len(kept) + (stop_at is not None),
                        "stopped": stop_at is not None,
                    }
                )
                done_tokens += samples[-1]["n_tokens"]
            out.append(samples)
        elapsed = time.time() - t0
        print(
            f"{desc}: {len(out)}/{len(prompts)} prompts x{k} | {done_tokens} tok | "
            f"{done_tokens / max(elapsed, 1e-9):.0f} tok/s | {elapsed:.1f}s",
            file=sys.stderr,
            flush=True,
        )
    return out
