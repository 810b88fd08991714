"""The training's CUDA warm-up (arenaflow.train.speed.cuda_warmup): one step of a one-layer copy of
the base's architecture, beside the model load, that draws nothing from the run's generators."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

from arenaflow.train.speed import cuda_warmup

pytest.importorskip("transformers")


@pytest.fixture(params=["tiny", "smollm2"])
def base(request, repo_root, tmp_path, monkeypatch):
    if request.param == "tiny":
        return repo_root / "models/tiny-arith"
    from transformers import LlamaConfig

    monkeypatch.syspath_prepend(str(repo_root / "benchmarks"))
    from zero_stage_cpu import SHAPES  # SmolLM2-135M's geometry; no weights needed

    LlamaConfig(**SHAPES["smollm2"]).save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize("lora", [False, True])
def test_the_warm_up_counts_what_one_layer_saves_for_its_backward(base, lora):
    """held_for counts the activations the one layer saves for backward (what each of the job's
    other layers adds to its first step, which the warm-up holds on CUDA): in proportion to the
    micro-batch's rows (a weight counted would not double, and the layer's weights outweigh
    these activations), and at least the layer's input and its MLP's two hidden projections."""
    from transformers import AutoConfig

    from arenaflow.train import objective

    dev = torch.device("cpu")
    adapters = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    skeleton = cuda_warmup.one_layer(str(base), dev, {**adapters, "fused": True} if lora else None)
    assert skeleton.job_layers == AutoConfig.from_pretrained(str(base)).num_hidden_layers
    model = cuda_warmup.materialize(skeleton, dev)
    length = 32

    def saved(rows: int) -> dict:
        ids = torch.arange(rows * length).reshape(rows, length) % model.config.vocab_size
        with cuda_warmup.held_for(cuda_warmup.first_layer(model), model, 5) as out:
            objective.sft_sum(model, {"input_ids": ids, "labels": ids})[0].backward()
        return out

    small, large = saved(4), saved(8)
    assert small["bytes"] == 5 * small["saved"]  # held, then freed when the block ended
    assert large["saved"] == pytest.approx(2 * small["saved"], rel=0.02)
    cfg, width = model.config, next(model.parameters()).element_size()
    assert small["saved"] >= 4 * length * (cfg.hidden_size + 2 * cfg.intermediate_size) * width


def test_the_warm_up_steps_a_one_layer_copy_and_leaves_the_generators_as_it_found_them(base):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    skeleton = cuda_warmup.one_layer(str(base), torch.device("cpu"))
    assert skeleton.device.type == "meta" and skeleton.config.num_hidden_layers == 1
    model = cuda_warmup.materialize(skeleton, torch.device("cpu"))
    assert model.training
    cuda_warmup.step(model, rows=4, length=32)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert model.get_input_embeddings().weight.grad is None  # frozen: no vocabulary-sized state
    assert torch.equal(torch.get_rng_state(), before)  # the run's seeded stream is untouched


def test_the_warm_up_clips_as_torch_does_through_deepspeeds_own_norm_checks(monkeypatch):
    """ds_norm_and_clip runs DeepSpeed's inf/NaN masking and validity test (their kernels are what
    the warm-up loads) and clips to the same gradients as torch's clip_grad_norm_."""
    from deepspeed.runtime import utils as ds_utils

    calls = []
    for name in ("mask_nan_or_inf_with_val_inplace", "is_invalid_grad_norm"):
        real = getattr(ds_utils, name)
        monkeypatch.setattr(
            ds_utils,
            name,
            lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k),
        )
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(s, generator=gen, dtype=torch.bfloat16) for s in ((64, 8), (8, 64), (3,))]
    oracle = [torch.nn.Parameter(g.float()) for g in grads]
    for o, g in zip(oracle, grads):
        o.grad = g.float().clone()
    torch.nn.utils.clip_grad_norm_(oracle, 0.5)
    cuda_warmup.ds_norm_and_clip(grads, 0.5)
    for o, g in zip(oracle, grads):
        torch.testing.assert_close(g.float(), o.grad, rtol=1e-2, atol=1e-3)  # bf16 rounding
    assert calls == ["mask_nan_or_inf_with_val_inplace", "is_invalid_grad_norm"]


def test_the_side_thread_imports_nothing(repo_root):
    """transformers' lazy module is not safe to import from two threads: the warm-up thread's
    import of the model class beside the main thread's `import peft` failed a fresh training
    process on the H200. launch() imports everything while it builds the skeleton. Run in a fresh
    interpreter, so that no other test has imported the model's modules already."""
    script = f"""
import json, sys, torch
from arenaflow.train.speed import cuda_warmup
fresh, seen, real_run = set(sys.modules), {{}}, cuda_warmup.run
def run_and_look(model, dev, outcome, shape):
    seen["before"] = set(sys.modules)
    real_run(model, dev, outcome, shape)
    seen["after"] = set(sys.modules)
cuda_warmup.run = run_and_look
thread = cuda_warmup.launch({str(repo_root / "models/tiny-arith")!r}, torch.device("cpu"))
cuda_warmup.finish(thread)
print(json.dumps({{"outcome": thread.outcome,
                  "by_launch": sorted(seen["before"] - fresh),
                  "by_thread": sorted(seen["after"] - seen["before"])}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert "s" in got["outcome"], got["outcome"]
    # transformers' lazy modules are the hazard; plain imports (torch's own) take Python's locks
    lazy = [m for m in got["by_thread"] if m.split(".")[0] in ("transformers", "peft")]
    assert lazy == [], lazy
    # not vacuous: the model's own module was first imported by launch(), on this thread
    assert "transformers.models.llama.modeling_llama" in got["by_launch"]


@pytest.mark.parametrize("shape", [(3, 17), None])
def test_the_warm_up_runs_at_the_jobs_micro_batch_shape(shape, repo_root, monkeypatch):
    """The shape of the job's largest micro-batch (data.largest_micro_batch), so that its first
    step finds the memory of its logits held and its products' kernels chosen; the default
    without one. It holds (on CUDA) the activations of the job's other layers."""
    from transformers import AutoConfig

    layers = AutoConfig.from_pretrained(repo_root / "models/tiny-arith").num_hidden_layers
    seen, real = [], cuda_warmup.step
    monkeypatch.setattr(
        cuda_warmup, "step", lambda model, *a: seen.append((a, model.training)) or real(model, *a)
    )
    thread = cuda_warmup.launch(str(repo_root / "models/tiny-arith"), torch.device("cpu"), shape)
    cuda_warmup.finish(thread)
    assert "s" in thread.outcome, thread.outcome
    want = shape or (cuda_warmup.ROWS, cuda_warmup.LENGTH)
    assert seen == [((*want, layers - 1), True)] and thread.outcome["shape"] == want
    assert thread.outcome["held"] == 0  # nothing held off CUDA


@pytest.mark.parametrize("where", ["skeleton", "thread"])
def test_a_failed_warm_up_is_reported_and_does_not_stop_the_job(where, tmp_path, caplog, repo_root):
    base = tmp_path / "missing" if where == "skeleton" else repo_root / "models/tiny-arith"
    with pytest.MonkeyPatch.context() as mp:
        if where == "thread":
            mp.setattr(cuda_warmup, "step", lambda model, *shape: 1 / 0)
        thread = cuda_warmup.launch(str(base), torch.device("cpu"))
        with caplog.at_level(logging.WARNING, logger=cuda_warmup.__name__):
            cuda_warmup.finish(thread)
    assert "error" in thread.outcome and "s" not in thread.outcome
    assert "CUDA warm-up failed" in caplog.text


def test_no_warm_up_without_cuda_or_when_turned_off(monkeypatch, repo_root, engine_settings):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_warmup.start(str(repo_root / "models/tiny-arith")) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    engine_settings(train_warmup=False)
    assert cuda_warmup.start(str(repo_root / "models/tiny-arith")) is None


def test_refill_does_nothing_without_a_cuda_warm_up(repo_root):
    """No warm-up (off, or no CUDA), or one that ran on CPU: nothing to grow back, and no CUDA
    call (this runs where CUDA is absent)."""
    assert cuda_warmup.refill(None) == 0
    thread = cuda_warmup.launch(str(repo_root / "models/tiny-arith"), torch.device("cpu"), (2, 8))
    outcome = cuda_warmup.finish(thread)
    assert "s" in outcome and "peak" not in outcome
    assert cuda_warmup.refill(outcome) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_warm_up_thread_finishes_and_leaves_the_cuda_generator_alone(base):
    torch.cuda.manual_seed(7)
    before = torch.cuda.get_rng_state()
    allocated = torch.cuda.memory_allocated()
    thread = cuda_warmup.start(str(base))
    cuda_warmup.finish(thread)
    assert "s" in thread.outcome, thread.outcome
    assert torch.equal(torch.cuda.get_rng_state(), before)
    # the other layers' activations are held by the cache, not by a tensor: what stays
    # allocated is the thread's cuBLAS workspaces (64 MiB on the H200), not the held block
    held = thread.outcome["held"]
    assert 0 < held <= torch.cuda.memory_reserved() - allocated
    if held > 2**30:  # SmolLM2's geometry: 2.9 GB at the default shape
        assert torch.cuda.memory_allocated() - allocated < held / 10
    # DeepSpeed's ZeRO-1/2 optimizer empties the cache while it builds; refill grows it back to
    # the warm-up step's peak (its held block included), once
    peak = thread.outcome["peak"]
    assert peak >= held
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < peak
    assert cuda_warmup.refill(thread.outcome) > 0
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() >= peak
    assert cuda_warmup.refill(thread.outcome) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("method", ["lora", "full"])
def test_the_warm_up_layer_carries_the_jobs_adapters(method, dtype, repo_root, monkeypatch):
    """A LoRA job's first step runs rank-r products through lora_fused's function: kernels of
    their own, which the first step loaded until the warm-up ran them too. The warm-up's layer
    has the adapters the job's model has (same modules, same shapes, the only trainable weights),
    runs them through the fused function, and builds them without drawing from the generators."""
    from arenaflow import models, schema
    from arenaflow.train import model as tmodel
    from arenaflow.train.speed import lora_fused

    base = str(repo_root / "models/tiny-arith")
    defaults = schema.load_yaml(repo_root / "config/config.yaml")["train_defaults"]
    hyper = schema.with_hyper_defaults({**defaults, "method": method})
    job = tmodel.build(base, "base", hyper).to(dtype)  # as DeepSpeed's bf16 engine casts it
    # bf16 is what the warm-up gets on CUDA; on CPU it runs in float32
    monkeypatch.setattr(models, "dtype_for", lambda dev: dtype)
    torch.manual_seed(5)
    before = torch.get_rng_state()
    layer = cuda_warmup.materialize(
        cuda_warmup.one_layer(base, torch.device("cpu"), cuda_warmup.job_lora(hyper)),
        torch.device("cpu"),
    )
    assert torch.equal(torch.get_rng_state(), before)

    def layer0(model):
        return {
            n.split(".layers.0.", 1)[1]: (tuple(p.shape), p.dtype, p.requires_grad)
            for n, p in model.named_parameters()
            if ".layers.0." in n
        }

    assert layer0(layer) == layer0(job)
    if method == "full":
        assert cuda_warmup.job_lora(hyper) is None
        return
    assert any("lora_A" in n for n in layer0(job))  # not vacuous
    # every adapted projection through the fused function, with its input's gradient taken (as
    # in every layer of the job but its first): the job's kernels, forward and backward
    calls, real = [], lora_fused.LoraLinearFunction.backward

    def backward(ctx, grad):
        calls.append(ctx.needs_input_grad[0])
        return real(ctx, grad)

    monkeypatch.setattr(lora_fused.LoraLinearFunction, "backward", staticmethod(backward))
    cuda_warmup.step(layer, rows=2, length=8)
    assert calls == [True] * len(hyper["lora"]["target_modules"])
    assert torch.equal(torch.get_rng_state(), before)


def test_the_warm_up_layer_groups_the_adapters_as_a_grouped_job_does(repo_root, monkeypatch):
    """With grouped_lora, the job's q/k/v and gate/up run through train/lora_grouped's function
    (kernels of their own shapes: a rank-3r product); the warm-up's layer runs them so too, and
    o_proj and down_proj through lora_fused's."""
    from arenaflow import schema
    from arenaflow.train.speed import lora_fused, lora_grouped

    base = str(repo_root / "models/tiny-arith")
    defaults = schema.load_yaml(repo_root / "config/config.yaml")["train_defaults"]
    hyper = schema.with_hyper_defaults({**defaults, "grouped_lora": True})
    assert len(hyper["lora"]["target_modules"]) == 7  # all seven: both groups whole
    layer = cuda_warmup.materialize(
        cuda_warmup.one_layer(base, torch.device("cpu"), cuda_warmup.job_lora(hyper)),
        torch.device("cpu"),
    )
    calls = []
    for fn in (lora_fused.LoraLinearFunction, lora_grouped.LoraGroupFunction):
        real = fn.backward

        def backward(ctx, *grads, fn=fn, real=real):
            calls.append(fn.__name__)
            return real(ctx, *grads)

        monkeypatch.setattr(fn, "backward", staticmethod(backward))
    cuda_warmup.step(layer, rows=2, length=8)
    assert sorted(calls) == ["LoraGroupFunction"] * 2 + ["LoraLinearFunction"] * 2
