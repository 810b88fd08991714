"""CUDA's lazy start-up, paid while a training job loads its model instead of in its first step.

PyTorch loads each CUDA kernel the first time it runs (CUDA_MODULE_LOADING=LAZY) and cuBLAS sets
itself up on the first product: about 0.7-1 s of a SmolLM2 LoRA job's first step on the H200
(benchmarks/train_startup_gpu.py), in a lineage whose trainings are 1-6 steps long, while the
seconds before it (corpus, weights, data plan) keep the host busy and the GPU idle. `start` runs
one training step of a one-layer model of the base's architecture, with the job's LoRA
adapters, at the shape of the job's largest micro-batch, on a side thread during that load, with
the gradient-norm checks DeepSpeed's step runs (ds_norm_and_clip); `finish` joins it before
DeepSpeed builds its engine, so nothing of the warm-up runs beside DeepSpeed, and returns what
it did (`refill` reads it once the engine is built).

On CUDA the step also holds, from its one layer's forward to the end of its backward, what the
job's other layers will save for their backward (the bytes the one layer saved, times the other
layers): the caching allocator then holds the job's first-step peak before that step. A training
grows its cache by expandable segments (train/dist.expandable_segments), each new piece mapped
from the driver on the host while the GPU waits. DeepSpeed's ZeRO-1/2 optimizer empties the cache
while it builds (torch.cuda.empty_cache() per parameter group,
deepspeed/runtime/zero/stage_1_and_2.py), which with expandable segments unmaps every free page,
the held ones too; so `refill`, called once the engine is built, grows the cache back to the
warm-up step's peak. With both, the first step at R220's and the B arms' micro-batches on the
H200 took within 0.015 s of a later one, against 0.07-0.09 s over it without the refill, and in
the lineage 0.18-0.26 s against 0.24-0.51 s before (BENCHMARKS.md, "DeepSpeed empties the
warm-up's cache").

The side thread imports nothing: `launch` builds the one-layer model's skeleton (config, classes,
parameters on the meta device) on the calling thread, and the thread only allocates, fills and
steps it. transformers' lazy top-level module is not safe to import from two threads at once: a
thread importing the model class while the main thread imported peft failed the job with
"cannot import name 'AutoModel' from 'transformers'" (a fresh `python -m arenaflow.train` on the
H200; the lineage's fork server had imported both before).

The warm-up draws no random numbers from the global generators (its weights are constants, its
tokens come from a private generator): the main thread seeds them for the run, and a step that
drew from them would shift the run's dropout and shuffles by a race. Off with engine
train_warmup false.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import torch

from arenaflow import engine
from arenaflow.train import objective
from arenaflow.train.speed import grad_norm

log = logging.getLogger(__name__)


def start(
    base_model: str, shape: tuple[int, int] | None = None, lora: dict | None = None
) -> threading.Thread | None:
    """A started warm-up thread on the current CUDA device; None without CUDA or when off.
    `shape`: (rows, tokens a row) of the job's largest micro-batch (data.largest_micro_batch);
    `lora`: the job's LoRA settings (hyper["lora"] plus "fused" and "grouped"), None for full
    fine-tuning."""
    if not engine.get("train_warmup") or not torch.cuda.is_available():
        return None
    return launch(base_model, torch.device("cuda", torch.cuda.current_device()), shape, lora)


def job_lora(hyper: dict) -> dict | None:
    """What `start` takes as `lora` for a job with these (default-filled) settings."""
    if hyper["method"] != "lora":
        return None
    return {**hyper["lora"], "fused": hyper["fused_lora"], "grouped": hyper["grouped_lora"]}


def launch(
    base_model: str,
    dev: torch.device,
    shape: tuple[int, int] | None = None,
    lora: dict | None = None,
) -> threading.Thread:
    """The skeleton built here, its warm-up started on a side thread (see the module's doc)."""
    outcome: dict = {}
    try:
        import deepspeed.runtime.utils  # noqa: F401 - for ds_norm_and_clip, imported here

        model = one_layer(base_model, dev, lora)
    except Exception as e:  # noqa: BLE001 - an optimisation only, as in run()
        model, outcome["error"] = None, f"{type(e).__name__}: {e}"
    thread = threading.Thread(
        target=run, args=(model, dev, outcome, shape), name="cuda-warmup", daemon=True
    )
    thread.outcome = outcome
    thread.start()
    return thread


def finish(thread: threading.Thread | None) -> dict | None:
    """Joins the warm-up, logs what it did (or why it failed) and returns its outcome (None
    without a warm-up), which `refill` reads."""
    if thread is None:
        return None
    thread.join()
    outcome = thread.outcome
    if "error" in outcome:  # an optimisation only: the first step pays what it did not
        log.warning("CUDA warm-up failed, the first step pays it: %s", outcome["error"])
    else:
        log.info(
            "CUDA warm-up: %.2f s at %s rows x tokens, beside the model load; %.1f GiB held "
            "(%.1f GiB of it for the activations of the job's other layers)",
            outcome["s"],
            outcome["shape"],
            torch.cuda.memory_reserved() / 2**30 if torch.cuda.is_available() else 0.0,
            outcome.get("held", 0) / 2**30,
        )
    return outcome


def refill(outcome: dict | None) -> int:
    """After the training engine is built, grows the caching allocator back to the warm-up
    step's peak (the outcome's "peak", set on CUDA only: what its step took, held block
    included) where something emptied it since (see the module's doc), at most 90 % of the
    device's free memory. The pages are mapped now, while start-up keeps the GPU idle anyway,
    not in the first step. Returns the bytes it allocated and freed into the cache."""
    peak = (outcome or {}).get("peak", 0)
    if not peak:
        return 0
    dev = torch.cuda.current_device()
    free_in_cache = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    want = min(peak - free_in_cache, int(torch.cuda.mem_get_info(dev)[0] * 0.9))
    if want <= 0:
        return 0
    t = time.perf_counter()
    torch.empty(want, dtype=torch.uint8, device=dev)  # freed at once: the cache keeps it
    log.info(
        "CUDA cache refilled by %.1f GiB to the warm-up's peak (%.2f s)",
        want / 2**30,
        time.perf_counter() - t,
    )
    return want


def run(model, dev: torch.device, outcome: dict, shape: tuple[int, int] | None = None) -> None:
    """The warm-up of a one_layer() skeleton (None: it failed, already in `outcome`) at `shape`
    (rows, tokens a row; None: ROWS x LENGTH); its seconds, or the error that stopped it, go to
    `outcome`."""
    if model is None:
        return
    t = time.perf_counter()
    outcome["shape"] = shape = shape or (ROWS, LENGTH)
    try:
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.set_device(dev)  # the current device is per thread
            before = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        outcome["held"] = step(materialize(model, dev), *shape, model.job_layers - 1)
        if cuda:
            torch.cuda.synchronize(dev)
            # the model's weights, loading beside it, count too: ~1 % of a SmolLM2 job's peak
            outcome["peak"] = torch.cuda.max_memory_allocated(dev) - before
        outcome["s"] = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - reported by finish(), on the main thread
        outcome["error"] = f"{type(e).__name__}: {e}"


def one_layer(
    base_model: str, dev: torch.device, lora: dict | None = None, native_norms: bool = True
):
    """The base's architecture with one layer in `dev`'s dtype, its parameters on the meta device
    (nothing allocated or initialised: no generator is drawn from), its norms through
    torch.rms_norm as a training too short to compile them has them (train/setup.setup_engine;
    `native_norms` False keeps the architecture's own, as arenaflow.decode.static's unfused step
    does).
    With `lora`, the job's adapters on it (dropout left out: on CUDA it would draw from the run's
    generator), through lora_fused's function where the job's are (lora["fused"]): a LoRA step's
    products at rank r are kernels of their own, and the first step paid for loading them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from arenaflow import fused, models

    cfg = AutoConfig.from_pretrained(base_model)
    job_layers, cfg.num_hidden_layers = cfg.num_hidden_layers, 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:1]
    cfg.use_cache = False
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=models.dtype_for(dev))
        if lora is not None:
            model = adapted(model, lora)
    if native_norms:
        fused.install_native_norms(model)
    model.job_layers = job_layers
    return model


def adapted(model, lora: dict):
    """`model` with PEFT LoRA adapters as train/model.build puts them, fused as the job's are."""
    from peft import get_peft_model

    from arenaflow.train import model as tmodel
    from arenaflow.train.speed import lora_fused, lora_grouped

    dtype = next(model.parameters()).dtype
    # in the base's dtype, as DeepSpeed's bf16 engine casts the job's adapters: PEFT keeps them
    # float32 beside a bf16 base, where lora_fused leaves them to PEFT's own path and kernels
    # no dropout (it would draw from the run's generator), no vocabulary-sized modules_to_save
    cfg = tmodel.lora_config({**lora, "dropout": 0.0, "modules_to_save": None})
    model = get_peft_model(model, cfg).to(dtype)
    if lora.get("fused", True):
        lora_fused.fuse(model)
        if lora.get("grouped", False):  # the job's grouped products are kernels of their own too
            lora_grouped.group(model)
    return model


def materialize(model, dev: torch.device):
    """The skeleton on `dev` with constant weights, in training mode."""
    model = filled(model, dev)
    # frozen, as in a LoRA run: no gradients or optimizer state for the vocabulary's matrices
    # (an 8 B base's are 1 B parameters)
    for m in (model.get_input_embeddings(), model.get_output_embeddings()):
        if m is not None:
            m.weight.requires_grad_(False)
    if INPUT_GRADS:
        model.enable_input_require_grads()
    return model.train()


def filled(model, dev: torch.device):
    """The skeleton allocated on `dev`, every weight a constant (no generator drawn from)."""
    model = model.to_empty(device=dev)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.02)
        for b in model.buffers():  # rotary frequencies: any finite values do
            b.fill_(1.0)
    return model


# The layer's input takes a gradient, as every layer's but the first does in the job: otherwise
# backward leaves out the products for the gradients of its projections' inputs, and the job's
# first step runs them (and picks their kernels) for the first time.
INPUT_GRADS = True


# Tokens of the warm-up step when the job's micro-batch is not known: enough rows x length that
# cuBLAS picks (and loads) the large-M kernels a real micro-batch uses; the first real step paid
# ~60 ms more in its products than the second without it (profile of a first step on the H200,
# docs/benchmark-log.md, runs 12-14). At the job's own micro-batch shape the warm-up also takes
# from the driver the memory of its vocabulary-sized logits, which the cache keeps for the first
# step: 31-34 GiB of a SmolLM2 LoRA training's ~55 GiB peak at 512 rows, and the first step of a
# training alone on the H200 went from 0.59-0.70 s to 0.44-0.61 s (BENCHMARKS.md, runs 23-24).
# One layer at the job's shape needs less than the job's step: nothing is held that the job
# would not take.
ROWS, LENGTH = 16, 256


def step(model, rows: int = ROWS, length: int = LENGTH, other_layers: int = 0) -> int:
    """What a training step runs: forward with the loss, backward, DeepSpeed's ZeRO-1/2 gradient
    norm and clipping (ds_norm_and_clip), fused AdamW. On CUDA, with HOLD_OTHER_LAYERS, the
    activations of `other_layers` more layers are held through forward and backward (see the
    module's doc). Returns the bytes held."""
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (rows, length), device=dev, generator=gen)
    batch = {"input_ids": ids, "labels": ids}
    hold = other_layers if dev.type == "cuda" and HOLD_OTHER_LAYERS else 0
    with held_for(first_layer(model), model, hold) as held:
        loss, _ = objective.sft_sum(model, batch)
        loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    ds_norm_and_clip([p.grad for p in params], 1.0)
    torch.optim.AdamW(params, lr=1e-9, fused=dev.type == "cuda").step()
    return held["bytes"]


# The other layers' activations held through the warm-up's step (off: the floor benchmark's
# --warmup-no-hold, to measure what holding them saves).
HOLD_OTHER_LAYERS = True


def first_layer(model):
    from arenaflow.train import model as tmodel

    return tmodel.unwrapped(model).get_decoder().layers[0]


@contextlib.contextmanager
def held_for(layer, model, other_layers: int):
    """Counts the bytes `layer`'s forward saves for backward (by storage, parameters left out:
    what each of the job's layers adds to its step) and, once that forward ends, holds
    `other_layers` times as many (at most 90 % of what the device has free) until the block
    exits. Yields {'saved': bytes the one layer saved, 'bytes': bytes held}."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}
    out, inside, block = {"saved": 0, "bytes": 0}, [], []
    dev = next(layer.parameters()).device

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if inside and ptr not in params:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    def after(*_):
        inside.clear()
        out["saved"] = sum(storages.values())
        if other_layers and out["saved"]:
            want = out["saved"] * other_layers
            if dev.type == "cuda":
                want = min(want, int(torch.cuda.mem_get_info(dev)[0] * 0.9))
            out["bytes"] = want
            block.append(torch.empty(want, dtype=torch.uint8, device=dev))

    hooks = [
        layer.register_forward_pre_hook(lambda *_: inside.append(1)),
        layer.register_forward_hook(after),
    ]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield out
    finally:
        block.clear()  # freed into the cache, which keeps it for the job's first step
        for h in hooks:
            h.remove()


def ds_norm_and_clip(grads: list[torch.Tensor], max_norm: float) -> None:
    """The operators DeepSpeed's ZeRO-1/2 optimizer runs on the gradients before its step (its
    gradient norm as train/grad_norm.py computes it, the inf/NaN masking and validity test,
    unscale_and_clip_grads), with DeepSpeed's own helpers where it has them. Each elementwise
    kernel here is loaded on its first call: isinf, isnan, logical_or, masked_fill_, lt and
    bitwise_or cost ~110 ms of a SmolLM2 LoRA job's first step on the H200 before this warm-up
    ran them."""
    from deepspeed.runtime import utils as ds_utils  # launch() imported it on its thread

    total = grad_norm.sum_of_squares([g.detach() for g in grads]).pow(0.5)
    ds_utils.mask_nan_or_inf_with_val_inplace(total, device=total.device)
    if ds_utils.is_invalid_grad_norm(total):  # a constant model's norm is finite
        return
    clip = torch.clamp((total + 1e-6) / max_norm, min=1.0)
    for g in grads:
        g.mul_(1.0 / clip)
