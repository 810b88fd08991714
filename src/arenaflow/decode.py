"""The static decode loop: arenaflow.sampling's fast path (`engine="static"`).

transformers' generate() launches every layer's kernels from Python at each step (~20 ms a step
on an H200 whatever the batch: BENCHMARKS.md), and with a padding mask its SDPA path copies each
grouped-query KV head once per query head at every step. This loop:
- preallocates transformers' StaticCache for the batch and runs the prompt through it eagerly;
- on CUDA, replays each decode step as one CUDA graph, captured once per key-length bucket so
  that a step reads only the part of the cache it can see;
- attends one query token over the cache with a grouped-query product that reads each KV head once.
On CPU the same step runs eagerly; tests hold its greedy output to generate()'s. Sampling draws
from the same distributions as generate() but from another random stream.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import time

import torch
from transformers import AttentionInterface, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from arenaflow import fused

ATTENTION = "arenaflow_decode"
FUSED_ENV = "ARENAFLOW_FUSED"  # diagnosis: "0" keeps transformers' unfused norm and SwiGLU on CUDA
KV_BUCKET = 32  # key positions per captured graph: a step reads < 32 cache rows it cannot see
SYNC_EVERY = 8  # decode steps between checks (one host sync) that every row has stopped


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """One query token attends over the first `attention_mask.shape[-1]` cache rows.

    query [B, H, 1, D]; key/value: the whole static cache [B, H_kv, L, D]; the bool mask
    [B, 1, 1, S] marks the rows each sequence may see. The prompt pass goes to SDPA."""
    if query.shape[2] > 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    kv_heads, seen = key.shape[1], attention_mask.shape[-1]
    # [B, H_kv, group, D] x [B, H_kv, D, S]: the query heads sharing a KV head read it together
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(q, key[:, :, :seen].transpose(-1, -2))
    softmax = _compiled_softmax() if query.is_cuda and fused_kernels_on() else masked_softmax
    probs = softmax(scores, attention_mask.view(batch, 1, 1, seen), scaling)
    out = torch.matmul(probs, value[:, :, :seen])
    return out.reshape(batch, heads, 1, dim).transpose(1, 2), None


def fused_kernels_on() -> bool:
    return os.environ.get(FUSED_ENV, "1") != "0"


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, scaling: float) -> torch.Tensor:
    return (scores.float() * scaling).masked_fill(~mask, float("-inf")).softmax(-1).to(scores.dtype)


@functools.cache
def _compiled_softmax():
    # one kernel instead of five (scale, mask, softmax, casts): ~0.7 ms of a 4.5 ms step at
    # batch 256
    return torch.compile(masked_softmax, dynamic=True)


AttentionInterface.register(ATTENTION, _attention)


def _cache_keyword(model) -> str:
    # transformers 5.24 renamed forward's `past_key_values` to `cache` (the old name warns)
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


KEEP_DECODERS = 4  # per model: each holds a KV cache for its batch


def decoder_for(
    model, batch: int, prompt_len: int, new_tokens: int, decoding, stops: list[int], pad: int
):
    """A StaticDecoder for this shape and decoding, reused across calls (its graphs are
    captured once); the least recently used beyond KEEP_DECODERS is dropped."""
    # kept on the model, so that they (and their KV caches) go when it goes
    kept = model.__dict__.setdefault("_arenaflow_decoders", {})
    key = (batch, prompt_len, new_tokens, decoding, tuple(stops), pad)
    decoder = kept.pop(key, None) or StaticDecoder(
        model, batch, prompt_len, new_tokens, decoding, stops, pad
    )
    kept[key] = decoder
    while len(kept) > KEEP_DECODERS:
        kept.pop(next(iter(kept)))
    return decoder


@contextlib.contextmanager
def _decode_attention(model):
    saved = model.config._attn_implementation
    model.config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        model.config._attn_implementation = saved


class StaticDecoder:
    """Decodes batches of `batch` left-padded prompts of `prompt_len` tokens, `new_tokens` each.

    Built once per shape and reused across batches: on CUDA its graphs are captured on first use.
    `decoding` is an arenaflow.sampling.Decoding; `stops` the stop token ids; `pad` fills
    positions after a row stopped."""

    def __init__(
        self,
        model,
        batch: int,
        prompt_len: int,
        new_tokens: int,
        decoding,
        stops: list[int],
        pad: int,
        graphs: bool | None = None,
    ):
        self.model, self.decoding, self.pad = model, decoding, pad
        self.cache_keyword = _cache_keyword(model)
        self.batch, self.prompt_len, self.new_tokens = batch, prompt_len, new_tokens
        self.length = prompt_len + new_tokens
        self.cache = StaticCache(config=model.config, max_cache_len=self.length)
        if any(getattr(layer, "is_sliding", False) for layer in self.cache.layers):
            raise ValueError(
                f"{type(model).__name__}: the static decode loop supports full attention "
                "layers only; set `engine: hf` for sliding-window models"
            )
        dev = model.device
        new = dict(device=dev)
        self.token = torch.zeros(batch, 1, dtype=torch.long, **new)  # the token fed next
        self.position = torch.zeros(batch, 1, dtype=torch.long, **new)  # its rotary position
        self.cursor = torch.zeros((), dtype=torch.long, **new)  # its cache row
        self.visible = torch.ones(
            batch, self.length, dtype=torch.bool, **new
        )  # False on left padding
        self.rows = torch.arange(self.length, **new)
        self.finished = torch.zeros(batch, dtype=torch.bool, **new)
        self.out = torch.full((batch, new_tokens), pad, dtype=torch.long, **new)
        self.written = torch.zeros(1, dtype=torch.long, **new)  # next column of `out`
        self.stops = torch.tensor(stops, dtype=torch.long, **new)
        self.seen = (
            torch.zeros(batch, model.config.vocab_size, dtype=torch.bool, **new)
            if decoding.repetition_penalty != 1.0
            else None
        )
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.last_decode = {"steps": 0, "seconds": 0.0}  # the decode steps of the last run, timed
        if dev.type == "cuda" and fused_kernels_on():
            fused.install(model)  # a step is ~1,200 small kernels without (BENCHMARKS.md)
        # graphs=False runs the step eagerly on a GPU too (the tests compare the two)
        use_graphs = dev.type == "cuda" if graphs is None else graphs
        self.pool = torch.cuda.graph_pool_handle() if use_graphs else None

    # -- the parts of a step: choosing a token, then feeding it ------------------------------
    def _choose(self, logits: torch.Tensor) -> None:
        """Picks each row's next token from float32 logits [B, V] and records it."""
        d = self.decoding
        if self.seen is not None:  # transformers' RepetitionPenaltyLogitsProcessor
            p = d.repetition_penalty
            logits = torch.where(self.seen, torch.where(logits < 0, logits * p, logits / p), logits)
        if d.temperature <= 0:
            nxt = logits.argmax(-1)
        else:
            probs = (logits / d.temperature).softmax(-1)
            if d.top_p < 1.0:  # keep the most likely tokens until their mass reaches top_p
                top, order = probs.sort(-1, descending=True)
                top = top.masked_fill(top.cumsum(-1) - top > d.top_p, 0.0)
                probs = torch.zeros_like(probs).scatter_(-1, order, top)
            # argmax(p / E), E ~ Exp(1), is a draw from p (the exponential race); unlike
            # torch.multinomial it never synchronises with the host, so it can be graph-captured
            nxt = (probs / torch.empty_like(probs).exponential_()).argmax(-1)
        nxt = torch.where(self.finished, self.pad, nxt)
        self.finished |= (nxt[:, None] == self.stops).any(-1)
        if self.seen is not None:
            self.seen.scatter_(1, nxt[:, None], True)
        self.out.index_copy_(1, self.written, nxt[:, None])
        self.written += 1
        self.token.copy_(nxt[:, None])

    def _step(self, seen: int) -> None:
        """Feeds `token` at cache row `cursor`, attending over the first `seen` rows."""
        mask = (self.visible[:, :seen] & (self.rows[:seen] <= self.cursor)).view(
            self.batch, 1, 1, seen
        )
        logits = self.model(
            input_ids=self.token,
            position_ids=self.position,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_keyword: self.cache},
        ).logits
        self._choose(logits[:, -1].float())
        self.position += 1
        self.cursor += 1

    def _set_cache_rows(self, rows: int) -> None:
        for layer in self.cache.layers:
            if not hasattr(layer, "cumulative_length"):
                raise RuntimeError(
                    f"transformers' {type(layer).__name__} has no cumulative_length: "
                    "the static decode loop needs transformers >= 5.17"
                )
            layer.cumulative_length.fill_(rows)

    def _capture(self) -> None:
        """One CUDA graph of the step per key-length bucket, each captured after two warm-up
        runs on a side stream. Warm-ups write real state (a cache row, the token buffers): every
        batch's prompt pass resets it, and the random state is put back as it was."""
        rng = torch.cuda.get_rng_state(self.model.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        for seen in sorted({self._bucket(i) for i in range(self.new_tokens - 1)}):
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._set_cache_rows(0)
                    self.cursor.zero_()
                    self.written.zero_()
                    self._step(seen)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._step(seen)
            self.graphs[seen] = graph
        torch.cuda.set_rng_state(rng, self.model.device)

    def _bucket(self, i: int) -> int:
        """Cache rows that decode step i (feeding row prompt_len + i) reads, rounded up."""
        return min(self.length, math.ceil((self.prompt_len + i + 1) / KV_BUCKET) * KV_BUCKET)

    # -- a batch -----------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
        """New token ids per row (pad after a row's stop token), for left-padded prompts of
        exactly (batch, prompt_len)."""
        if tuple(input_ids.shape) != (self.batch, self.prompt_len):
            raise ValueError(
                f"prompts of shape {tuple(input_ids.shape)}; this decoder was built for "
                f"({self.batch}, {self.prompt_len})"
            )
        with _decode_attention(self.model):
            if self.pool is not None and not self.graphs:
                self._capture()
            self._prefill(input_ids, attention_mask.bool())
            written = int(self.written)  # waits for the prompt pass: the clock below times decoding
            t0 = time.perf_counter()
            for i in range(self.new_tokens - 1):
                if self.graphs:
                    self.graphs[self._bucket(i)].replay()
                else:
                    self._step(self._bucket(i))
                if (i + 1) % SYNC_EVERY == 0 and bool(self.finished.all()):
                    break
        out = self.out[:, : int(self.written)].tolist()
        self.last_decode = {
            "steps": int(self.written) - written,
            "seconds": time.perf_counter() - t0,
        }
        return out

    def _prefill(self, input_ids: torch.Tensor, valid: torch.Tensor) -> None:
        p = self.prompt_len
        self.visible[:, :p] = valid
        self.finished.zero_()
        self.out.fill_(self.pad)
        self.written.zero_()
        if self.seen is not None:  # prompt tokens, left padding not counted (as generate() >= 5.24)
            self.seen.copy_(
                torch.zeros(self.seen.shape, dtype=torch.long, device=valid.device).scatter_add_(
                    1, input_ids, valid.long()
                )
                > 0
            )
        self._set_cache_rows(0)
        causal = torch.ones(p, self.length, dtype=torch.bool, device=valid.device).tril()
        # a padding row may see itself, so that no row of the prompt pass is fully masked (NaN)
        mask = (causal & self.visible[:, None, :]) | torch.eye(
            p, self.length, dtype=torch.bool, device=valid.device
        )
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=mask[:, None],
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_keyword: self.cache},
        ).logits
        self.position.copy_(positions[:, -1:] + 1)
        self.cursor.fill_(p)
        self._choose(logits[:, -1].float())
