"""Batched generation from a causal LM: k samples per prompt, or greedy, stopping on stop tokens.

Shared by candidate sampling, readouts, the tiny model's builder and the bundle reload check,
so every stage decodes the same way.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch

from arenaflow import chat, models
from arenaflow.decode import parts as decode_parts
from arenaflow.decode import static as decode
from arenaflow.decode import steps as decode_steps

PROMPT_BUCKET = 32  # static engine: prompts are left-padded to a multiple of this


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


def stop_token_ids(tokenizer, generation_config=None) -> list[int]:
    """ChatML's <|im_end|> and <|endoftext|> where the tokenizer has them, its EOS, every
    end-of-turn token its chat format writes after an assistant turn (arenaflow.chat.format_of:
    Llama 3's <|eot_id|>, Gemma's <end_of_turn>, Phi-3's <|end|>) and generation_config's EOS
    ids: a base stops where its own template ends a turn, which is often not its EOS."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    ids = [i for i in ids if i is not None and i != tokenizer.unk_token_id]
    fmt = chat.format_of(tokenizer)
    eos = getattr(generation_config, "eos_token_id", None)
    extra = [
        tokenizer.eos_token_id,
        *(fmt.stop_ids() if fmt is not None else []),
        *(eos if isinstance(eos, list) else [eos]),
    ]
    for i in extra:
        if i is not None and i not in ids:
            ids.append(i)
    return ids


def prompts_per_batch(batch_size: int, k: int) -> int:
    """Prompts decoded together: their k samples each make at most `batch_size` rows."""
    return max(1, batch_size // k)


def first_batch_rows(prompts: int, k: int, batch_size: int) -> int:
    """Rows (prompts x k samples) of the first batch generate() decodes for `prompts` prompts."""
    return min(prompts_per_batch(batch_size, k), prompts) * k


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
    job: decode_parts.Job | None = None,
    first_batch: int = 0,
) -> list[list[dict]]:
    """For each rendered prompt, `k` samples: {text, n_tokens, stopped}.

    engine "hf" decodes with transformers' generate() (`cache_implementation` goes to it);
    "static" with arenaflow.decode.static's static-cache loop, CUDA graphs on a GPU (the same greedy
    output; samples from the same distributions, drawn from another random stream); "vllm" with
    vLLM, `model` being arenaflow.decode.vllm_engine's Policy (one request per prompt, seeded
    from seed and the prompt's index; no batches kept for `job`).
    Each batch is seeded with seed + batch index, so results depend only on (seed, prompts,
    batch_size, k, engine), never on what ran before in the process. With `job`, each batch
    decoded is kept as a part beside job.out, and a batch a verified part of the same job holds
    is read back instead of decoded (arenaflow.decode.parts). `first_batch`: the index of
    `prompts`' first batch in a larger pool they are a shard of (arenaflow.shards), whose seeds
    and part numbers its batches take.
    """
    if engine == "vllm":  # `model` is vllm_engine.load_policy's; vLLM schedules every batch
        return model.generate(tokenizer, prompts, decoding, k, seed, desc)
    if engine not in ("hf", "static"):
        raise ValueError(f"engine {engine!r}: expected 'hf', 'static' or 'vllm'")
    model.eval()
    if engine == "static":
        decode_steps.plan(len(prompts) * k * decoding.max_new_tokens)
    stops = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    pad = models.pad_id(tokenizer)
    out: list[list[dict]] = []
    per_batch = prompts_per_batch(batch_size, k)
    kept = None
    if job is not None:
        record = decode_parts.identity(job, prompts, decoding, k, seed, batch_size)
        kept = decode_parts.Parts(job.out, {**record, "cache": cache_implementation})
    t0, done_tokens = time.time(), 0
    for b, start in enumerate(range(0, len(prompts), per_batch), start=first_batch):
        chunk = prompts[start : start + per_batch]
        batch = kept.get(b, len(chunk)) if kept is not None else None
        if batch is not None:
            out.extend(batch)
            continue
        # the static loop keeps one decoder (and its CUDA graphs) per padded prompt length
        enc = left_pad(tokenizer, chunk, pad, PROMPT_BUCKET if engine == "static" else 1)
        enc = {key: v.to(model.device) for key, v in enc.items()}
        torch.manual_seed(seed + b)
        new, timing = _decode_batch(
            model, enc, decoding, k, stops, pad, engine, cache_implementation
        )
        batch = [
            [_sample(tokenizer, ids, stops) for ids in new[i * k : (i + 1) * k]]
            for i in range(len(chunk))
        ]
        if kept is not None:
            kept.put(b, batch)
        done_tokens += sum(s["n_tokens"] for samples in batch for s in samples)
        out.extend(batch)
        progress(desc, len(out), len(prompts), k, done_tokens, time.time() - t0, timing)
    return out


def _decode_batch(
    model,
    enc: dict,
    decoding: Decoding,
    k: int,
    stops: list[int],
    pad: int,
    engine: str,
    cache_implementation: str | None,
) -> tuple[list[list[int]], dict | None]:
    """The new tokens of `k` samples per prompt of the left-padded batch `enc`, prompt-major,
    and (static engine) the decoder's timing of it: decode.StaticDecoder.last_decode plus the
    batch's seconds, the decoder's construction included."""
    if engine == "static":
        t = time.perf_counter()
        ids, mask = (
            enc[key].repeat_interleave(k, dim=0) for key in ("input_ids", "attention_mask")
        )
        # each prompt's k rows share its prompt pass
        decoder = decode.decoder_for(
            model, *ids.shape, decoding.max_new_tokens, decoding, stops, pad, share=k
        )
        new = decoder.run(ids, mask)
        return new, {**decoder.last_decode, "batch_seconds": time.perf_counter() - t}
    gen = model.generate(
        **enc,
        max_new_tokens=decoding.max_new_tokens,
        num_return_sequences=k,
        eos_token_id=stops,
        pad_token_id=pad,
        **({"cache_implementation": cache_implementation} if cache_implementation else {}),
        **decoding.generate_kwargs(),
    )
    return gen[:, enc["input_ids"].shape[1] :].tolist(), None


def until_stop(ids: list[int], stops) -> list[int]:
    """New token ids through the first stop token (kept), all of them if none stops."""
    stop_at = next((j for j, t in enumerate(ids) if t in stops), None)
    return ids if stop_at is None else ids[: stop_at + 1]


def _sample(tokenizer, ids: list[int], stops) -> dict:
    """{text, n_tokens, stopped} of one sample's new tokens, cut at the first stop token (which
    counts)."""
    cut = until_stop(ids, stops)
    stopped = len(cut) < len(ids) or (bool(cut) and cut[-1] in stops)
    return {
        "text": tokenizer.decode(cut[:-1] if stopped else cut, skip_special_tokens=True),
        "n_tokens": len(cut),
        "stopped": stopped,
    }


def left_pad(tokenizer, texts: list[str], pad: int, multiple: int = 1) -> dict:
    """input_ids and attention_mask, left-padded with `pad` to the longest text (rounded up to
    `multiple`). Padded here, not by tokenizer(padding=True): that refuses a tokenizer without a
    pad token, and setting one (or padding_side) would change a tokenizer a bundle then saves."""
    rows = tokenizer(texts, add_special_tokens=False)["input_ids"]
    width = -(-max(map(len, rows)) // multiple) * multiple
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask}


def progress(
    desc: str,
    done: int,
    total: int,
    k: int,
    tokens: int,
    elapsed: float,
    timing: dict | None = None,
) -> None:
    """One line per batch, so a log shows how far a long job is and when it will end; with the
    static decoder's `timing` of the batch (_decode_batch), where its time went."""
    eta = elapsed / done * (total - done) if done else 0.0
    where = ""
    if timing:
        setup = timing["batch_seconds"] - timing["prompt_seconds"] - timing["seconds"]
        where = (
            f" | batch {timing['batch_seconds']:.2f}s: set-up {setup:.2f}s (ready "
            f"{timing['ready_seconds']:.2f}s), prompt pass {timing['prompt_seconds']:.2f}s, "
            f"{timing['steps']} steps {timing['seconds']:.2f}s"
        )
    print(
        f"{desc}: {done}/{total} prompts x{k} | {tokens} tok | "
        f"{tokens / max(elapsed, 1e-9):.0f} tok/s "
        f"| {elapsed:.1f}s | ETA {eta:.0f}s{where}",
        file=sys.stderr,
        flush=True,
    )
