"""The training's CUDA warm-up (arenaflow.train.cuda_warmup): one step of a one-layer copy of
the base's architecture, beside the model load, that draws nothing from the run's generators."""

from __future__ import annotations

import logging

import pytest
import torch

from arenaflow.train import cuda_warmup

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


def test_the_warm_up_steps_a_one_layer_copy_and_leaves_the_generators_as_it_found_them(base):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    model = cuda_warmup.one_layer(str(base), torch.device("cpu"))
    assert model.config.num_hidden_layers == 1 and model.training
    cuda_warmup.step(model)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert model.get_input_embeddings().weight.grad is None  # frozen: no vocabulary-sized state
    assert torch.equal(torch.get_rng_state(), before)  # the run's seeded stream is untouched


def test_a_failed_warm_up_is_reported_and_does_not_stop_the_job(tmp_path, caplog):
    outcome: dict = {}
    cuda_warmup.run(str(tmp_path / "missing"), torch.device("cpu"), outcome)
    assert "error" in outcome and "s" not in outcome

    class Done:
        def join(self):
            pass

    done = Done()
    done.outcome = outcome
    with caplog.at_level(logging.WARNING, logger=cuda_warmup.__name__):
        cuda_warmup.finish(done)
    assert "CUDA warm-up failed" in caplog.text


def test_no_warm_up_without_cuda_or_when_turned_off(monkeypatch, repo_root):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_warmup.start(str(repo_root / "models/tiny-arith")) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(cuda_warmup.ENV, "0")
    assert cuda_warmup.start(str(repo_root / "models/tiny-arith")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_warm_up_thread_finishes_and_leaves_the_cuda_generator_alone(repo_root):
    torch.cuda.manual_seed(7)
    before = torch.cuda.get_rng_state()
    thread = cuda_warmup.start(str(repo_root / "models/tiny-arith"))
    cuda_warmup.finish(thread)
    assert "s" in thread.outcome, thread.outcome
    assert torch.equal(torch.cuda.get_rng_state(), before)
