"""A static decode step's pieces, which arenaflow.decode.static's StaticDecoder runs.

Its forward is one of two (step_kind): "llama", arenaflow.decode.llamastep's pure function,
compiled on CUDA as one graph (llama_step, compiled_llama_step); or "hf", transformers' modelling
code with its StaticCache, arenaflow.fused's kernels and the decode attention registered here,
compiled where the planned tokens pay for it (plan, fused_kernels_on). Then the choice (choose).
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from arenaflow import engine
from arenaflow.decode import llamastep

ATTENTION = "arenaflow_decode"
ATTENTION_UNFUSED = "arenaflow_decode_unfused"  # never the compiled softmax (fused=False)


# Compiling them costs a process ~4-5 s alone and 7-11 s inside a lineage (SmolLM2's corpora on
# the H200, run 7: first batch 8-13 s against 1.3-2.7 s uncompiled), and saves 5-7 us a generated
# token (SmolLM2 sampling 37.9k -> 48.0k tokens/s; the 1.2 B shape at batch 256, 7.33 -> 5.67 ms
# a step). A plan counts every row's max_new_tokens, but rows stop early: those corpora planned
# 1.28-2.56 M tokens and generated 12-15 % of them, so the compile pays back from about 8 M
# planned tokens (BENCHMARKS.md); below that a job spends it with the GPU idle.
AUTO_MIN_TOKENS = 8_000_000
_planned_tokens: int | None = None


def _attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, fused_ok=True, **kwargs
):
    """One query token attends over the first `attention_mask.shape[-1]` cache rows.

    query [B, H, 1, D]; key/value: the whole static cache [B, H_kv, L, D]; the bool mask
    [B, 1, 1, S] marks the rows each sequence may see. A grouped-query product reads each KV head
    once (with a padding mask, transformers' SDPA path copies each once per query head at every
    step). The prompt pass goes to SDPA. The softmax is compiled where fused_kernels_on() and
    `fused_ok`."""
    if query.shape[2] > 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    kv_heads, seen = key.shape[1], attention_mask.shape[-1]
    # [B, H_kv, group, D] x [B, H_kv, D, S]: the query heads sharing a KV head read it together
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(q, key[:, :, :seen].transpose(-1, -2))
    compiled = fused_ok and query.is_cuda and fused_kernels_on()
    softmax = _compiled_softmax() if compiled else masked_softmax
    probs = softmax(scores, attention_mask.view(batch, 1, 1, seen), scaling)
    out = torch.matmul(probs, value[:, :, :seen])
    return out.reshape(batch, heads, 1, dim).transpose(1, 2), None


def plan(tokens: int) -> None:
    """The tokens this process is about to decode (prompts x k x max_new_tokens, at most),
    which `auto` weighs against the compile."""
    global _planned_tokens
    _planned_tokens = tokens


def fused_kernels_on() -> bool:
    """On CUDA, the compiled norm, SwiGLU and masked-softmax kernels: engine fused_decode true or
    false, or (auto) from AUTO_MIN_TOKENS planned tokens (plan())."""
    setting = engine.get("fused_decode")
    if setting != "auto":
        return bool(setting)
    return _planned_tokens is None or _planned_tokens >= AUTO_MIN_TOKENS


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor, scaling: float) -> torch.Tensor:
    return (scores.float() * scaling).masked_fill(~mask, float("-inf")).softmax(-1).to(scores.dtype)


@functools.cache
def _compiled_softmax():
    # one kernel instead of five (scale, mask, softmax, casts): ~0.7 ms of a 4.5 ms step at
    # batch 256
    return torch.compile(masked_softmax, dynamic=True)


AttentionInterface.register(ATTENTION, _attention)
AttentionInterface.register(ATTENTION_UNFUSED, functools.partial(_attention, fused_ok=False))


def cache_keyword(model) -> str:
    # transformers 5.24 renamed forward's `past_key_values` to `cache` (the old name warns)
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@contextlib.contextmanager
def decode_attention(model, name: str = ATTENTION):
    saved = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = saved


STEPS = ("auto", "llama", "hf")
RECOMPILE_LIMIT = 64  # graphs of the Llama step per process (see compiled_llama_step)


def step_kind(model, step: str | None = None) -> str:
    """The step a decoder of `model` runs, "llama" or "hf". `step` (else engine decode_step):
    "auto" takes "llama" where arenaflow.decode.llamastep supports the model (a plain
    LlamaForCausalLM), on CPU only for now (CUDA: "hf", see below; every other architecture takes
    "hf"); "llama" for a model it does not support is an error naming the architecture."""
    want = step or engine.get("decode_step")
    if want not in STEPS:
        raise ValueError(f"decode step {want!r} (engine decode_step): expected one of {STEPS}")
    why = llamastep.unsupported(model) if want != "hf" else None
    if want == "llama" and why:
        raise ValueError(
            f"the packed Llama decode step cannot decode {why}; set engine decode_step to 'hf' "
            "(or auto)"
        )
    if want == "auto" and not why and model.device.type == "cuda":
        # On the H200 the compiled step decodes x1.2-1.7 faster, and where its bf16 greedy
        # output leaves generate()'s it is at a rounding tie (gpu_bench's tie-aware check), but
        # its first call compiles for 52-86 s cold, 12-13 s warm (BENCHMARKS.md), which a
        # lineage's short readouts cannot pay back: "auto" keeps "hf" there
        return "hf"
    return "hf" if want == "hf" or why else "llama"


def choose(logits: torch.Tensor, st: dict, d, pad: int) -> None:
    """Picks each row's next token from float32 logits [B, V] and records it in the decoder's
    buffers `st` (token, finished, seen, out, written, stops); `d` is a sampling.Decoding:
    greedy, or temperature, top-p and repetition penalty. Sampling draws from the same
    distributions as generate() but from another random stream."""
    penalised = d.repetition_penalty != 1.0  # st["seen"] is then set (StaticDecoder.use)
    if penalised:  # transformers' RepetitionPenaltyLogitsProcessor
        p = d.repetition_penalty
        logits = torch.where(st["seen"], torch.where(logits < 0, logits * p, logits / p), logits)
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
    nxt = torch.where(st["finished"], pad, nxt)
    st["finished"].bitwise_or_((nxt[:, None] == st["stops"]).any(-1))
    if penalised:
        st["seen"].scatter_(1, nxt[:, None], True)
    st["out"].index_copy_(1, st["written"], nxt[:, None])
    st["written"].add_(1)
    st["token"].copy_(nxt[:, None])


def llama_step(weights, shape, cache, fwd: dict, seen_rows, tables, logits) -> None:
    """A decode step's forward as a pure function of tensors (compiled as one graph on CUDA):
    feeds fwd["token"] at cache row fwd["cursor"], attending over the cache rows `seen_rows`
    (0..S-1) that are up to the cursor and not left padding (fwd["visible"]), writes the
    float32 logits into `logits` and advances the position and cursor; `choose` picks the token.
    S is a tensor's size, not an int, so that one compiled graph serves every bucket."""
    mask = llamastep.decode_mask(shape, fwd["visible"], fwd["cursor"], seen_rows)
    rows = fwd["cursor"].view(1)
    logits.copy_(
        llamastep.forward(weights, shape, cache, fwd["token"], fwd["position"], rows, mask, tables)
    )
    fwd["position"].add_(1)
    fwd["cursor"].add_(1)


@functools.cache
def compiled_llama_step():
    # one compiled function for every decoder, so that dynamo's cache serves all of them: the
    # step's forward (embedding, layers, final norm, lm_head) as ONE fullgraph graph, in
    # inductor's default mode, inside StaticDecoder's own per-bucket torch.cuda.CUDAGraph capture
    # (not mode="reduce-overhead": its cudagraph trees skip graphs that mutate non-parameter
    # inputs, which the KV cache and token buffers are, and re-record on new input addresses;
    # ours keeps one graph per bucket over fixed buffers). On CPU llama_step runs eagerly
    # (compiled=True tests this one). A compile failure falls back, with a log line, to "hf".
    # Batch 1 compiles apart; past dynamo's recompile limit (default 8) a fullgraph compile
    # raises (and the decoder falls back to step "hf"), so the limit is raised
    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(llama_step, fullgraph=True, options=inductor_options())


def inductor_options() -> dict:
    """fallback_random: the exponential race uses aten's generator, as the eager step does.
    Inductor's default mode otherwise (mm and bmm through cuBLAS, no autotuning at compile)."""
    return {"fallback_random": True}
