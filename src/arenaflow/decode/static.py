"""The static decode loop: arenaflow.decode.sampling's fast path (`engine="static"`).
Over 400 lines: StaticDecoder is one loop over fixed-address buffers that its CUDA graphs capture.

generate() launches every layer's kernels from Python at each step (~20 ms a step on an H200
whatever the batch: BENCHMARKS.md). StaticDecoder preallocates a batch's KV cache and on CUDA
replays each step (arenaflow.decode.steps) from CUDA graphs captured per key-length bucket;
decoder_for keeps one per shape. Tests hold greedy output to generate()'s.
"""

from __future__ import annotations

import functools
import math
import sys
import time

import torch
from transformers import StaticCache

from arenaflow import engine, fused
from arenaflow.decode import llamastep, steps

KV_BUCKET = 32  # key positions per captured graph: a step reads < 32 cache rows it cannot see
SYNC_EVERY = 8  # decode steps between checks (one host sync) that every row has stopped
# prompt tokens (batch x prompt length) up to which the Llama step's prompt pass is replayed as a
# CUDA graph too: at batch 1 its ~400 kernels launched one by one took ~17 ms of a 162 ms call on
# the H200, for ~1.5 ms of GPU work; larger passes keep the GPU busy eagerly and would hold their
# activations in the graph's memory pool
PREFILL_GRAPH_TOKENS = 4096
# eager runs of a step before its capture, on a side stream: what a first call sets up (the
# KV cache, cuBLAS's choices for a new shape, a compiled kernel's recompile for a new bucket)
# happens there, not in the graph. One does it: each further one cost a SmolLM2 readout's
# decoder ~50 ms a bucket on the H200, host-bound (benchmarks/decode_prepare_gpu.py). For the
# first bucket, the prompt pass and the choice; a later bucket's first real step is its one
# (StaticDecoder._forward_graph)
CAPTURE_WARMUPS = 1


KEEP_DECODERS = 4  # per model: each holds a KV cache for its batch


def decoder_for(
    model, batch: int, prompt_len: int, new_tokens: int, decoding, stops: list[int], pad: int
):
    """A StaticDecoder for this shape, set to `decoding` and reused across calls and decodings
    (its graphs are captured once); the least recently used beyond KEEP_DECODERS is dropped."""
    # kept on the model, so that they (and their KV caches) go when it goes
    kept = model.__dict__.setdefault("_arenaflow_decoders", {})
    # the engine's choices too: a decoder built under another step or attention is another
    chosen = (engine.get("decode_step"), engine.get("decode_attention"))
    key = (batch, prompt_len, new_tokens, tuple(stops), pad, chosen)
    decoder = kept.pop(key, None) or StaticDecoder(
        model, batch, prompt_len, new_tokens, decoding, stops, pad
    )
    kept[key] = decoder
    while len(kept) > KEEP_DECODERS:
        kept.pop(next(iter(kept)))
    return decoder.use(decoding)


class StaticDecoder:
    """Decodes batches of `batch` left-padded prompts of `prompt_len` tokens, `new_tokens` each.

    Built once per shape and reused across batches and decodings: on CUDA its forward's graphs
    are captured on first use, and a small graph of the token choice per decoding, which reads
    the forward's logits from a fixed buffer; so a readout's served regime does not capture the
    forward again after its greedy one (at SmolLM2's readout shape on the H200 a first sampled
    batch cost 0.37-0.54 s over a replayed one through a decoder of its own, 0.01-0.04 s through
    the greedy one's: benchmarks/decode_prepare_gpu.py). `decoding`
    is an arenaflow.decode.sampling.Decoding (`use` sets another); `stops` the stop token ids; `pad`
    fills positions after a row stopped. `step` "auto" | "llama" | "hf" (step_kind); `graphs`
    False runs steps without CUDA graphs on a GPU too, `compiled` False the Llama step
    uncompiled (both default to "on CUDA"), `fused` False the hf step without arenaflow.fused's
    kernels and compiled softmax even where fused_kernels_on() (so that nothing compiles:
    decode_warmup's decoder).
    `path` names what runs, e.g. "llama-compiled+graphs"."""

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
        step: str | None = None,
        compiled: bool | None = None,
        fused: bool = True,
    ):
        self.model, self.pad = model, pad
        self.batch, self.prompt_len, self.new_tokens = batch, prompt_len, new_tokens
        self.length = prompt_len + new_tokens
        dev = model.device
        new = dict(device=dev)
        self.rows = torch.arange(self.length, **new)
        # False on left padding. It and the Llama cache hold one spare row past `length`, so
        # that no bucket's slice of them is whole (contiguous): else the last bucket compiles apart
        self.visible = torch.ones(batch, self.length + 1, dtype=torch.bool, **new)
        self.st = {  # the buffers a step reads and writes, at fixed addresses (graph-captured)
            "token": torch.zeros(batch, 1, dtype=torch.long, **new),  # the token fed next
            "position": torch.zeros(batch, 1, dtype=torch.long, **new),  # its rotary position
            "cursor": torch.zeros((), dtype=torch.long, **new),  # its cache row
            "finished": torch.zeros(batch, dtype=torch.bool, **new),
            "out": torch.full((batch, new_tokens), pad, dtype=torch.long, **new),
            "written": torch.zeros(1, dtype=torch.long, **new),  # next column of `out`
            "stops": torch.tensor(stops, dtype=torch.long, **new),
            "visible": self.visible,
            "seen": None,  # tokens seen per row, for a repetition penalty (use())
        }
        # what the forward reads and advances; the choice reads the logits it leaves here
        self.fwd = {k: self.st[k] for k in ("token", "position", "cursor", "visible")}
        self.logits = torch.zeros(batch, model.config.vocab_size, dtype=torch.float32, **new)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # the forward, per bucket
        self.choosers: dict = {}  # the token choice, per decoding
        self.prefill_graph: torch.cuda.CUDAGraph | None = None  # reads self.prompt_in
        self.prompt_in = (
            torch.zeros(batch, prompt_len, dtype=torch.long, **new),
            torch.ones(batch, prompt_len, dtype=torch.bool, **new),
        )
        # the decode steps of the last run, timed, its prompt pass before them, and what it took
        # to get ready before that (compiles and captures, on a decoder's first run)
        self.last_decode = {"steps": 0, "seconds": 0.0, "prompt_seconds": 0.0, "ready_seconds": 0.0}
        self.use_graphs = dev.type == "cuda" if graphs is None else graphs
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.prepared = False  # compiled and captured (_ready)
        if steps.step_kind(model, step) == "llama":
            self._setup_llama(dev.type == "cuda" if compiled is None else compiled)
        else:
            self._setup_hf(fused)
        self.use(decoding)

    def use(self, decoding) -> StaticDecoder:
        """Decodes with `decoding` from the next run on (its choice's graph captured then)."""
        self.decoding = decoding
        if decoding.repetition_penalty != 1.0 and self.st["seen"] is None:
            vocab = self.model.config.vocab_size
            self.st["seen"] = torch.zeros(
                self.batch, vocab, dtype=torch.bool, device=self.model.device
            )
        return self

    def _setup_llama(self, compiled: bool) -> None:
        m = self.model
        self.shape = llamastep.shape_of(m, self.batch)
        self.weights = llamastep.packed(m)
        self.kv = llamastep.new_cache(m, self.shape, self.batch, self.length + 1)
        self.tables = llamastep.rotary_tables(m, self.length)
        self.compiled = compiled
        self.path = ("llama-compiled" if compiled else "llama-eager") + (
            "+graphs" if self.use_graphs else ""
        )

    def _setup_hf(self, fused_ok: bool = True) -> None:
        m = self.model
        self.compiled = False
        self.attention = steps.ATTENTION if fused_ok else steps.ATTENTION_UNFUSED
        self.cache_keyword = steps.cache_keyword(m)
        self.cache = StaticCache(config=m.config, max_cache_len=self.length)
        if any(getattr(layer, "is_sliding", False) for layer in self.cache.layers):
            raise ValueError(
                f"{type(m).__name__}: the static decode loop supports full attention "
                "layers only; set `engine: hf` for sliding-window models"
            )
        if m.device.type == "cuda" and steps.fused_kernels_on() and fused_ok:
            fused.install(m)  # a step is ~1,200 small kernels without (BENCHMARKS.md)
        self.path = "hf" + ("+graphs" if self.use_graphs else "")

    # -- a decode step ---------------------------------------------------------------------------
    def _step(self, seen: int) -> None:
        """Feeds `token` at cache row `cursor`, attending over the first `seen` rows, and
        chooses the next token."""
        self._forward(seen)
        self._choose()

    def _forward(self, seen: int) -> None:
        """The step's forward: its logits into self.logits, the position and cursor advanced."""
        if self.path.startswith("llama"):
            seen_rows = self.rows[:seen]
            fn = steps.llama_step
            if self.compiled:
                fn = steps.compiled_llama_step()
                self._mark_dynamic(seen_rows)
            fn(self.weights, self.shape, self.kv, self.fwd, seen_rows, self.tables, self.logits)
            return
        st = self.st
        mask = self.visible[:, :seen] & (self.rows[:seen] <= st["cursor"])
        with steps.decode_attention(self.model, self.attention):
            logits = self.model(
                input_ids=st["token"],
                position_ids=st["position"],
                attention_mask=mask.view(self.batch, 1, 1, seen),
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_keyword: self.cache},
            ).logits
        self.logits.copy_(logits[:, -1])
        st["position"].add_(1)
        st["cursor"].add_(1)

    def _choose(self) -> None:
        steps.choose(self.logits, self.st, self.decoding, self.pad)

    def _mark_dynamic(self, seen_rows: torch.Tensor) -> None:
        """Compiles the step for any bucket (rows seen), batch and cache length, so that one
        graph serves every decoder: else each new shape would compile anew."""
        mark = torch._dynamo.maybe_mark_dynamic
        mark(seen_rows, 0)
        for t in (*self.kv[0], *self.kv[1]):
            mark(t, 0), mark(t, 2)
        for t in (self.fwd["token"], self.fwd["position"], self.visible, self.logits):
            mark(t, 0)
        mark(self.visible, 1)
        for t in self.tables:
            mark(t, 0)

    def _set_cache_rows(self, rows: int) -> None:
        for layer in self.cache.layers:
            if not hasattr(layer, "cumulative_length"):
                raise RuntimeError(
                    f"transformers' {type(layer).__name__} has no cumulative_length: "
                    "the static decode loop needs transformers >= 5.17"
                )
            layer.cumulative_length.fill_(rows)

    def _rewind(self) -> None:
        """Puts the step's cursor, position and output column back to 0 (warm-ups run real
        steps; every batch's prompt pass then resets all the state they wrote)."""
        if self.path.startswith("hf"):
            self._set_cache_rows(0)
        for key in ("cursor", "position", "written"):
            self.st[key].zero_()

    def _capture(self) -> None:
        """The CUDA graph of the first bucket's forward, which every batch's first step reads
        (and where a compiled step that cannot be captured shows while _prepare_or_fall_back
        can still fall back); each later bucket's is captured when a batch first reaches it
        (_forward_graph), so that buckets no batch reaches cost nothing: a readout's greedy
        rows on SmolLM2 stopped within 32-48 of 160 steps in 10 of 12 arms, two of six buckets
        (runs 48-51; the base's and B4's ran all 160)."""
        seen = self._bucket(0)
        self.graphs[seen] = self._captured(
            functools.partial(self._forward, seen), warm=functools.partial(self._rewound, seen)
        )

    def _forward_graph(self, seen: int) -> None:
        """The forward from its bucket's graph; a bucket's first step runs eagerly (the
        capture's warm-up, on real state), then its graph is captured for the next."""
        graph = self.graphs.get(seen)
        if graph is not None:
            graph.replay()
            return
        self._forward(seen)
        self.graphs[seen] = self._graph_of(functools.partial(self._forward, seen))

    def _rewound(self, seen: int | None = None) -> None:
        """A warm-up: from the cursor's start, so that each writes the rows a replay does; the
        forward at `seen` rows, or (None) the token choice."""
        self._rewind()
        if seen is None:
            self._choose()
        else:
            self._forward(seen)

    def _captured(self, fn, warm=None) -> torch.cuda.CUDAGraph:
        """A CUDA graph of fn, captured after CAPTURE_WARMUPS runs of `warm` (default fn) on a
        side stream."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(CAPTURE_WARMUPS):
                (warm or fn)()
        torch.cuda.current_stream().wait_stream(side)
        return self._graph_of(fn)

    def _graph_of(self, fn) -> torch.cuda.CUDAGraph:
        """fn captured (not run) into a CUDA graph in the decoder's memory pool."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            fn()
        return graph

    def _prepare(self) -> None:
        """Compiles the Llama step (one warm-up step), then captures the graphs; the random
        state is put back as it was, so that a fresh decoder draws as a reused one does."""
        if self.new_tokens < 2:  # the prompt pass chooses the only token: no step runs
            return
        if not self.compiled and self.pool is None:  # nothing to compile or capture
            return
        with self._own_rng():
            if self.compiled:  # compiled on the main stream, before any capture
                self._rewind()
                self._forward(self._bucket(0))
            if self.pool is not None:
                self._capture()
                if (
                    self.path.startswith("llama")
                    and self.prompt_in[0].numel() <= PREFILL_GRAPH_TOKENS
                ):
                    self.prefill_graph = self._captured(lambda: self._prefill_body(*self.prompt_in))

    def _own_rng(self):
        """Draws made inside (warm-ups) leave the generators as they were."""
        dev = self.model.device
        return torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else [])

    def _ready(self) -> None:
        """Compiles and captures on first use (again after the model's weights changed), and
        the choice's graph of a decoding not seen yet; a compiled Llama step that fails to
        compile or capture falls back, loudly, to transformers' modelling code rather than fail
        a job."""
        if self.path.startswith("llama"):
            weights = llamastep.packed(self.model)
            if weights is not self.weights:  # the graphs read the old copy
                self.weights, self.graphs, self.prepared = weights, {}, False
                self.prefill_graph = None
        if not self.prepared:
            self._prepare_or_fall_back()
            self.prepared = True
        if self.graphs and self.decoding not in self.choosers:
            with self._own_rng():
                self.choosers[self.decoding] = self._captured(self._choose, warm=self._rewound)

    def _prepare_or_fall_back(self) -> None:
        try:
            self._prepare()
        except Exception as e:
            if not self.compiled:
                raise
            print(
                f"arenaflow.decode.static: the compiled Llama decode step failed "
                f"({type(e).__name__}: {str(e)[:500]}); falling back to transformers' "
                "modelling code (step 'hf')",
                file=sys.stderr,
                flush=True,
            )
            self.graphs, self.kv, self.weights, self.prefill_graph = {}, None, None, None
            if self.pool is not None:
                self.pool = torch.cuda.graph_pool_handle()
            self._setup_hf(fused_ok=False)  # its compiled kernels might fail the same way
            self.path += " (fallback)"
            self._prepare()

    def _bucket(self, i: int) -> int:
        """Cache rows that decode step i (feeding row prompt_len + i) reads, rounded up."""
        return min(self.length, math.ceil((self.prompt_len + i + 1) / KV_BUCKET) * KV_BUCKET)

    # -- a batch ---------------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
        """New token ids per row (pad after a row's stop token), for left-padded prompts of
        exactly (batch, prompt_len)."""
        if tuple(input_ids.shape) != (self.batch, self.prompt_len):
            raise ValueError(
                f"prompts of shape {tuple(input_ids.shape)}; this decoder was built for "
                f"({self.batch}, {self.prompt_len})"
            )
        t_ready = time.perf_counter()
        self._ready()
        chooser = self.choosers.get(self.decoding)
        t_prompt = time.perf_counter()
        self._prefill(input_ids, attention_mask.bool())
        self._seed_seen(input_ids, attention_mask.bool())
        if chooser:
            chooser.replay()
        else:
            self._choose()
        written = int(self.st["written"])  # waits for the prompt pass: the clock times decoding
        t0 = time.perf_counter()
        for i in range(self.new_tokens - 1):
            if chooser:
                self._forward_graph(self._bucket(i))
                chooser.replay()
            else:
                self._step(self._bucket(i))
            if (i + 1) % SYNC_EVERY == 0 and bool(self.st["finished"].all()):
                break
        out = self.st["out"][:, : int(self.st["written"])].tolist()
        self.last_decode = {
            "steps": int(self.st["written"]) - written,
            "seconds": time.perf_counter() - t0,
            "prompt_seconds": t0 - t_prompt,
            "ready_seconds": t_prompt - t_ready,
        }
        return out

    def _prefill(self, input_ids: torch.Tensor, valid: torch.Tensor) -> None:
        """The prompt pass: replayed from its graph where it has one (PREFILL_GRAPH_TOKENS),
        else eager."""
        if self.prefill_graph is None:
            self._prefill_body(input_ids, valid)
            return
        self.prompt_in[0].copy_(input_ids)
        self.prompt_in[1].copy_(valid)
        self.prefill_graph.replay()

    def _seed_seen(self, input_ids: torch.Tensor, valid: torch.Tensor) -> None:
        """A repetition penalty's seen tokens: the prompt's, padding not counted (as generate()
        >= 5.24)."""
        seen = self.st["seen"]
        if self.decoding.repetition_penalty == 1.0:  # not read (choose)
            return
        counts = torch.zeros(seen.shape, dtype=torch.long, device=seen.device)
        seen.copy_(counts.scatter_add_(1, input_ids, valid.long()) > 0)

    def _prefill_body(self, input_ids: torch.Tensor, valid: torch.Tensor) -> None:
        """Resets the buffers and fills the cache's first prompt_len rows; the prompt's last
        logits go to self.logits, for the first token's choice."""
        p, st, dev = self.prompt_len, self.st, valid.device
        self.visible[:, :p] = valid
        st["finished"].zero_()
        st["out"].fill_(self.pad)
        st["written"].zero_()
        # a padding row may see itself, so that no row of the prompt pass is fully masked (NaN)
        causal = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
        mask = (causal & valid[:, None, :]) | torch.eye(p, dtype=torch.bool, device=dev)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        if self.path.startswith("llama"):
            rows = torch.arange(p, device=dev)
            logits = llamastep.forward(
                self.weights,
                self.shape,
                self.kv,
                input_ids,
                positions,
                rows,
                mask[:, None],
                self.tables,
            )
        else:
            logits = self._prefill_hf(input_ids, positions, mask)
        self.logits.copy_(logits)
        st["position"].copy_(positions[:, -1:] + 1)
        st["cursor"].fill_(p)

    def _prefill_hf(self, input_ids, positions, mask) -> torch.Tensor:
        self._set_cache_rows(0)
        wide = torch.zeros(*mask.shape[:2], self.length, dtype=torch.bool, device=mask.device)
        wide[:, :, : self.prompt_len] = mask  # transformers' mask spans the whole static cache
        with steps.decode_attention(self.model, self.attention):
            logits = self.model(
                input_ids=input_ids,
                position_ids=positions,
                attention_mask=wide[:, None],
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_keyword: self.cache},
            ).logits
        return logits[:, -1].float()
