"""CUDA's lazy start-up of a decoding job (a readout, candidate sampling), paid while it loads
its model instead of in its first batch.

PyTorch loads each CUDA kernel the first time it runs (CUDA_MODULE_LOADING=LAZY): a readout's
first greedy batch on the H200 took 1.9 s against 0.5 s for each later one of the same 600
prompts in the lineage (BENCHMARKS.md, runs 46-47), of which the decoder's CUDA graphs took
~0.4 s (benchmarks/decode_prepare_gpu.py) and loading the prompt pass's and the step's kernels
most of the rest, while the GPU sat idle. `start` runs the static decode loop's prompt pass and
a few steps, eagerly and greedy, through a one-layer model of the base's architecture (constant
weights) at the job's batch and KV-cache length, on a side thread while the main thread loads
the model; `finish` joins it before the first batch. With it (and graphs captured per bucket
as batches reach them) that first batch took 0.5-1.0 s (runs 48-51). Nothing is captured or
compiled there: CUDA's global capture mode forbids the synchronous copies the main thread's load
makes while a capture is open, and compiling belongs to the job.

Like the training's warm-up (train/cuda_warmup, whose one-layer skeleton this reuses), the side
thread imports nothing (the skeleton and its classes are built on the calling thread) and draws
nothing from the global generators (greedy; its prompts come from a private generator). It runs
only where the job decodes with decode's "hf" step (the CUDA default); off with engine
decode_warmup false.
"""

from __future__ import annotations

import sys
import threading
import time

import torch

from arenaflow import engine, jobclock

# tokens a warm-up prompt: the prompt pass's products at rows x PROMPT_LEN pick the large-M
# kernels a real batch's do (its prompts, left-padded to a multiple of sampling.PROMPT_BUCKET,
# are not known before the tokenizer has loaded)
PROMPT_LEN = 128


def start(base_model: str, rows: int, new_tokens: int, decoder: str) -> threading.Thread | None:
    """A started warm-up thread on the current CUDA device for a job whose first batch decodes
    `rows` rows of up to `new_tokens` tokens with `decoder` ("static": arenaflow.decode.static;
    "hf" has nothing to warm); None without CUDA or when engine decode_warmup is off."""
    off = decoder != "static" or not engine.get("decode_warmup")
    if off or not torch.cuda.is_available():
        return None
    dev = torch.device("cuda", torch.cuda.current_device())
    return launch(base_model, dev, rows, new_tokens)


def launch(base_model: str, dev: torch.device, rows: int, new_tokens: int) -> threading.Thread:
    """The skeleton built here, its warm-up started on a side thread (see the module's doc)."""
    from arenaflow.decode import static as decode  # noqa: F401 - for run(), imported here
    from arenaflow.train.speed import cuda_warmup

    outcome: dict = {"rows": rows, "new_tokens": new_tokens}
    try:
        model = cuda_warmup.one_layer(base_model, dev, native_norms=False)
    except Exception as e:  # noqa: BLE001 - an optimisation only, as in run()
        model, outcome["error"] = None, f"{type(e).__name__}: {e}"
    thread = threading.Thread(
        target=run, args=(model, dev, outcome), name="decode-warmup", daemon=True
    )
    thread.outcome = outcome
    thread.start()
    return thread


def run(model, dev: torch.device, outcome: dict) -> None:
    """The warm-up of a one_layer() skeleton (None: it failed, already in `outcome`) on `dev`:
    a greedy prompt pass of outcome["rows"] rows and a few steps, over a KV cache as long as the
    job's (PROMPT_LEN + outcome["new_tokens"] rows: the prompt pass's attention reads all of them,
    and its kernels depend on that length); its seconds, or the error that stopped it, go to
    `outcome`."""
    from arenaflow.decode import sampling
    from arenaflow.decode import static as decode
    from arenaflow.decode import steps as decode_steps
    from arenaflow.train.speed import cuda_warmup

    if model is None:
        return
    t = time.perf_counter()
    try:
        if dev.type == "cuda":
            torch.cuda.set_device(dev)  # the current device is per thread
        model = cuda_warmup.filled(model, dev).eval()
        if decode_steps.step_kind(model) != "hf":
            raise ValueError(f"decode step {decode_steps.step_kind(model)!r}: only 'hf' is warmed")
        gen = torch.Generator(device=dev).manual_seed(0)
        shape = (outcome["rows"], PROMPT_LEN)
        ids = torch.randint(0, model.config.vocab_size, shape, device=dev, generator=gen)
        new = outcome["new_tokens"]
        greedy = sampling.Decoding(temperature=0.0, max_new_tokens=new)
        # every token a stop token: every row stops at its first, and the loop ends at its
        # first check (decode.SYNC_EVERY steps), the kernels of a step all loaded by then
        stops = list(range(model.config.vocab_size))
        decoder = decode.StaticDecoder(
            model, *shape, new, greedy, stops, 0, graphs=False, compiled=False, fused=False
        )
        decoder.run(ids, torch.ones_like(ids))
        outcome["steps"] = decoder.last_decode["steps"]
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        outcome["s"] = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - reported by finish(), on the main thread
        outcome["error"] = f"{type(e).__name__}: {e}"


def finish(thread: threading.Thread | None, job: str | None = None) -> dict | None:
    """Joins the warm-up, logs what it did (or why it did not) and returns its outcome (None
    without a warm-up). With `job`, the wait for it is a start-up phase of its own
    (arenaflow.jobclock: "warm-up")."""
    if thread is None:
        return None
    thread.join()
    if job is not None:
        jobclock.mark(job, "warm-up")
    outcome = thread.outcome
    if "error" in outcome:  # an optimisation only: the first batch pays what it did not
        said = f"not done, the first batch pays it ({outcome['error']})"
    else:
        said = (
            f"{outcome['s']:.2f} s at {outcome['rows']} rows x {PROMPT_LEN} tokens, a cache for "
            f"{outcome['new_tokens']} more"
        )
    print(f"arenaflow: decode warm-up {said}", file=sys.stderr, flush=True)
    return outcome
