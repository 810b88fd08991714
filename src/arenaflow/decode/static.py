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
from arenaflow.decode import llamastep, rows, steps

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
    model,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    decoding,
    stops: list[int],
    pad: int,
    share: int = 1,
):
    """A StaticDecoder for this shape, set to `decoding` and reused across calls and decodings
    (its graphs are captured once); the least recently used beyond KEEP_DECODERS is dropped."""
    # kept on the model, so that they (and their KV caches) go when it goes
    kept = model.__dict__.setdefault("_arenaflow_decoders", {})
    # the engine's choices too: a decoder built under another step or attention is another
    chosen = (engine.get("decode_step"), engine.get("decode_attention"))
    key = (batch, prompt_len, new_tokens, tuple(stops), pad, share, chosen)
    decoder = kept.pop(key, None) or StaticDecoder(
        model, batch, prompt_len, new_tokens, decoding, stops, pad, share=share
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
    `share` k: each run of k consecutive rows is one prompt's k samples, whose prompt pass runs
    once and is copied to the k rows; `shrink` (default on) moves the rows still decoding to
    the front as others stop and steps run on fewer rows (arenaflow.decode.rows). Both off is
    the loop as it was before them, which benchmarks/useful_tokens.py compares against.
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
        share: int = 1,
        shrink: bool = True,
    ):
        if share < 1 or batch % share:
            raise ValueError(f"share={share}: batch {batch} is not whole runs of share rows")
        self.model, self.pad = model, pad
        self.batch, self.prompt_len, self.new_tokens = batch, prompt_len, new_tokens
        self.share, self.shrink = share, shrink
        self.length = prompt_len + new_tokens
        dev = model.device
        new = dict(device=dev)
        self.rows = torch.arange(self.length, **new)
        # the per-row buffers a step reads and writes, whole, at fixed addresses
        # (graph-captured); a step sees their first self.n rows (_narrow)
        self.whole = {
            "token": torch.zeros(batch, 1, dtype=torch.long, **new),  # the token fed next
            "position": torch.zeros(batch, 1, dtype=torch.long, **new),  # its rotary position
            "finished": torch.zeros(batch, dtype=torch.bool, **new),
            "out": torch.full((batch, new_tokens), pad, dtype=torch.long, **new),
            # False on left padding. It and the Llama cache hold one spare row past `length`, so
            # that no bucket's slice of them is whole (contiguous): else the last bucket
            # compiles apart
            "visible": torch.ones(batch, self.length + 1, dtype=torch.bool, **new),
            "seen": None,  # tokens seen per row, for a repetition penalty (use())
            "origin": torch.arange(batch, **new),  # the batch row each row decodes (shrink)
            "logits": torch.zeros(batch, model.config.vocab_size, dtype=torch.float32, **new),
        }
        self.st = {
            "cursor": torch.zeros((), dtype=torch.long, **new),  # the fed token's cache row
            "written": torch.zeros(1, dtype=torch.long, **new),  # next column of `out`
            "stops": torch.tensor(stops, dtype=torch.long, **new),
        }
        self.by_rows: dict[int, tuple[dict, dict]] = {}  # graphs and choosers per row count
        self.prefill_graph: torch.cuda.CUDAGraph | None = None  # reads self.prompt_in
        self.prompt_in = (
            torch.zeros(batch // share, prompt_len, dtype=torch.long, **new),
            torch.ones(batch // share, prompt_len, dtype=torch.bool, **new),
        )
        self.kv_whole = self.hf_whole = None  # the KV cache's whole tensors (Llama, hf step)
        # the decode steps of the last run, timed, its prompt pass before them, and what it took
        # to get ready before that (compiles and captures, on a decoder's first run)
        self.last_decode = {
            "steps": 0,
            "seconds": 0.0,
            "prompt_seconds": 0.0,
            "ready_seconds": 0.0,
            "shrinks": [],
        }
        self.use_graphs = dev.type == "cuda" if graphs is None else graphs
        self.pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.prepared = False  # compiled and captured (_ready)
        if steps.step_kind(model, step) == "llama":
            self._setup_llama(dev.type == "cuda" if compiled is None else compiled)
        else:
            self._setup_hf(fused)
        self._narrow(batch)
        self.use(decoding)

    def _narrow(self, n: int) -> None:
        """Steps from now on run on the first n rows of every per-row buffer (views: the
        whole buffers keep their addresses), with the graphs captured for n rows."""
        self.n = n
        for key, t in self.whole.items():
            self.st[key] = None if t is None else t[:n]
        self.visible, self.logits = self.st["visible"], self.st["logits"]
        # what the forward reads and advances; the choice reads the logits it leaves
        self.fwd = {k: self.st[k] for k in ("token", "position", "cursor", "visible")}
        if self.kv_whole is not None:
            self.kv = tuple([t[:n] for t in side] for side in self.kv_whole)
        if self.hf_whole is not None:
            for layer, (keys, values) in zip(self.cache.layers, self.hf_whole, strict=True):
                layer.keys, layer.values = keys[:n], values[:n]
        # the forward per bucket, and the token choice per decoding
        self.graphs, self.choosers = self.by_rows.setdefault(n, ({}, {}))

    def _forget_graphs(self) -> None:
        self.by_rows = {}
        self._narrow(self.n)

    def use(self, decoding) -> StaticDecoder:
        """Decodes with `decoding` from the next run on (its choice's graph captured then)."""
        self.decoding = decoding
        if decoding.repetition_penalty != 1.0 and self.whole["seen"] is None:
            vocab = self.model.config.vocab_size
            self.whole["seen"] = torch.zeros(
                self.batch, vocab, dtype=torch.bool, device=self.model.device
            )
            self._narrow(self.n)
        return self

    def _setup_llama(self, compiled: bool) -> None:
        m = self.model
        self.shape = llamastep.shape_of(m, self.batch)
        self.weights = llamastep.packed(m)
        self.kv_whole = llamastep.new_cache(m, self.shape, self.batch, self.length + 1)
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
        # a shared prompt pass (share > 1) runs on the distinct prompts, in a cache of their own
        self.prompt_cache = StaticCache(config=m.config, max_cache_len=self.prompt_len)
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
                attention_mask=mask.view(self.n, 1, 1, seen),
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

    def _set_cache_rows(self, rows: int, cache=None) -> None:
        for layer in (self.cache if cache is None else cache).layers:
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
                self.weights, self.prepared = weights, False
                self.prefill_graph = None
                self._forget_graphs()
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
            self.kv_whole, self.weights, self.prefill_graph = None, None, None
            if self.pool is not None:
                self.pool = torch.cuda.graph_pool_handle()
            self._setup_hf(fused_ok=False)  # its compiled kernels might fail the same way
            self._forget_graphs()
            self.path += " (fallback)"
            self._prepare()

    def _bucket(self, i: int) -> int:
        """Cache rows that decode step i (feeding row prompt_len + i) reads, rounded up."""
        return min(self.length, math.ceil((self.prompt_len + i + 1) / KV_BUCKET) * KV_BUCKET)

    # -- a batch ---------------------------------------------------------------------------------
    @torch.no_grad()
    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
        """New token ids per row (pad after a row's stop token), for left-padded prompts of
        exactly (batch, prompt_len), each run of `share` rows one prompt."""
        if tuple(input_ids.shape) != (self.batch, self.prompt_len):
            raise ValueError(
                f"prompts of shape {tuple(input_ids.shape)}; this decoder was built for "
                f"({self.batch}, {self.prompt_len})"
            )
        firsts, first_valid = rows.distinct_prompts(input_ids, attention_mask.bool(), self.share)
        t_ready = time.perf_counter()
        self._narrow(self.batch)
        self._ready()
        graphed = self.decoding in self.choosers
        t_prompt = time.perf_counter()
        self._prefill(firsts, first_valid)
        self._seed_seen(input_ids, attention_mask.bool())
        self._choose_graphed() if graphed else self._choose()
        written = int(self.st["written"])  # waits for the prompt pass: the clock times decoding
        t0 = time.perf_counter()
        self.final = None  # rows that left the batch, at their batch row (_shrink)
        shrinks = []  # (decode steps run, rows from then on)
        for i in range(self.new_tokens - 1):
            if graphed:
                self._forward_graph(self._bucket(i))
                self._choose_graphed()
            else:
                self._step(self._bucket(i))
            if (i + 1) % SYNC_EVERY == 0:
                live = int(self.n - self.st["finished"].sum())
                if live == 0:
                    break
                size = rows.shrunk_size(live, self.n, self.batch) if self.shrink else self.n
                if size < self.n:
                    self._shrink(size, self.prompt_len + i + 1)
                    shrinks.append((i + 1, size))
        out = self._collected()[:, : int(self.st["written"])].tolist()
        self._narrow(self.batch)
        self.last_decode = {
            "steps": int(self.st["written"]) - written,
            "seconds": time.perf_counter() - t0,
            "prompt_seconds": t0 - t_prompt,
            "ready_seconds": t_prompt - t_ready,
            "shrinks": shrinks,
        }
        return out

    def _choose_graphed(self) -> None:
        """The token choice from its graph for this decoding and row count; a row count's
        first runs eagerly (on real state: a warm-up would rewind it), then is captured."""
        graph = self.choosers.get(self.decoding)
        if graph is not None:
            graph.replay()
            return
        self._choose()
        with self._own_rng():  # capturing a draw must not advance the stream a replay reads
            self.choosers[self.decoding] = self._graph_of(self._choose)

    def _shrink(self, size: int, cache_rows: int) -> None:
        """Moves the rows still decoding to the front and narrows the batch to `size` rows; the
        outputs of the rows that leave are kept at their batch rows in self.final."""
        st = self.st
        if self.final is None:
            self.final = torch.full_like(self.whole["out"], self.pad)
        self.final.index_copy_(0, st["origin"], st["out"])
        keep = rows.order(st["finished"], size)
        per_row = [t for key, t in self.whole.items() if key != "logits" and t is not None]
        rows.gather(per_row, keep)
        kv = self.kv_whole or ([k for k, _ in self.hf_whole], [v for _, v in self.hf_whole])
        rows.gather([*kv[0], *kv[1]], keep, along_rows=cache_rows)
        self._narrow(size)

    def _collected(self) -> torch.Tensor:
        """Every batch row's new tokens, in batch order."""
        if self.final is None:  # never shrunk: the rows are in order
            return self.st["out"]
        return self.final.index_copy_(0, self.st["origin"], self.st["out"])

    def _prefill(self, input_ids: torch.Tensor, valid: torch.Tensor) -> None:
        """The prompt pass of the distinct prompts (batch / share rows): replayed from its graph
        where it has one (PREFILL_GRAPH_TOKENS), else eager."""
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
        """Resets the buffers and fills the cache's first prompt_len rows from the distinct
        prompts, each copied to its `share` rows; the prompts' last logits go to self.logits,
        for the first token's choice."""
        p, st, dev, k = self.prompt_len, self.st, valid.device, self.share
        self.visible[:, :p] = valid.repeat_interleave(k, 0)
        st["origin"].copy_(torch.arange(self.batch, device=dev))
        st["finished"].zero_()
        st["out"].fill_(self.pad)
        st["written"].zero_()
        # a padding row may see itself, so that no row of the prompt pass is fully masked (NaN)
        causal = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
        mask = (causal & valid[:, None, :]) | torch.eye(p, dtype=torch.bool, device=dev)
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        if self.path.startswith("llama"):
            prompts = input_ids.shape[0]
            kv = tuple([t[:prompts] for t in side] for side in self.kv)
            at = torch.arange(p, device=dev)
            logits = llamastep.forward(
                self.weights, self.shape, kv, input_ids, positions, at, mask[:, None], self.tables
            )
            if k > 1:
                for t in (*self.kv[0], *self.kv[1]):
                    rows.spread(t[:, :, :p], k)
        else:
            logits = self._prefill_hf(input_ids, positions, mask)
        self.logits.copy_(logits.repeat_interleave(k, 0))
        st["position"].copy_((positions[:, -1:] + 1).repeat_interleave(k, 0))
        st["cursor"].fill_(p)

    def _prefill_hf(self, input_ids, positions, mask) -> torch.Tensor:
        """The prompt pass through transformers' modelling code: into the decode cache, or
        (share > 1) into the prompts' own cache, then copied to each prompt's rows."""
        shared = self.share > 1
        cache = self.prompt_cache if shared else self.cache
        self._set_cache_rows(0, cache)
        width = self.prompt_len if shared else self.length
        wide = torch.zeros(*mask.shape[:2], width, dtype=torch.bool, device=mask.device)
        wide[:, :, : self.prompt_len] = mask  # transformers' mask spans the whole static cache
        with steps.decode_attention(self.model, self.attention):
            logits = self.model(
                input_ids=input_ids,
                position_ids=positions,
                attention_mask=wide[:, None],
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_keyword: cache},
            ).logits
        if shared:
            self._spread_prompt_cache()
        if self.hf_whole is None:  # the decode cache's tensors, allocated by its first write
            self.hf_whole = [(layer.keys, layer.values) for layer in self.cache.layers]
        return logits[:, -1].float()

    def _spread_prompt_cache(self) -> None:
        p, k = self.prompt_len, self.share
        for layer, prompt in zip(self.cache.layers, self.prompt_cache.layers, strict=True):
            keys, values = (x.repeat_interleave(k, 0) for x in (prompt.keys, prompt.values))
            if not layer.is_initialized:
                layer.lazy_initialization(keys, values)
            layer.keys[:, :, :p] = keys
            layer.values[:, :, :p] = values
        self._set_cache_rows(p)
