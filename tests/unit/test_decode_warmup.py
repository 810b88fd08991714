"""The decoding jobs' warm-up (arenaflow.decode.warmup): a greedy prompt pass and one step of the
static decode loop through a one-layer copy of the base's architecture, beside the model load,
that draws nothing from the run's generators and compiles or captures nothing."""

from __future__ import annotations

import pytest
import torch
from devices import CUDA

from arenaflow import fused, jobclock
from arenaflow.decode import sampling
from arenaflow.decode import static as decode
from arenaflow.decode import steps as decode_steps
from arenaflow.decode import warmup as decode_warmup
from arenaflow.train.speed import cuda_warmup

pytest.importorskip("transformers")

CPU = torch.device("cpu")


@pytest.fixture(params=["tiny", "smollm2"])
def base(request, repo_root, tmp_path, monkeypatch, engine_settings):
    # on CPU decode's "auto" step is the packed Llama one; the warm-up is made for "hf"
    engine_settings(decode_step="hf")
    if request.param == "tiny":
        return str(repo_root / "models/tiny-arith")
    from transformers import LlamaConfig

    monkeypatch.syspath_prepend(str(repo_root / "benchmarks"))
    from zero_stage_cpu import SHAPES  # SmolLM2-135M's geometry; no weights needed

    LlamaConfig(**SHAPES["smollm2"]).save_pretrained(tmp_path)
    return str(tmp_path)


def test_the_warm_up_decodes_at_the_jobs_rows_and_draws_nothing(base):
    """It runs (no error recorded) with the architecture's own norms, as the unfused decode step
    has them, and leaves the global generator where it was: the job seeds it per batch, and a
    warm-up that drew from it beside the load would shift the job's draws by a race."""
    skeleton = cuda_warmup.one_layer(base, CPU, native_norms=False)
    norms = list(fused._llama_norms(skeleton))
    assert norms and all("forward" not in vars(m) for m in norms)  # not rerouted
    outcome = {"rows": 3, "new_tokens": 40}
    before = torch.get_rng_state()
    decode_warmup.run(skeleton, CPU, outcome)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["s"] > 0
    assert outcome["steps"] == decode.SYNC_EVERY  # every row stopped: not 39 steps
    assert torch.equal(torch.get_rng_state(), before)


def test_the_warm_up_leaves_a_step_it_is_not_made_for_to_the_job(base, engine_settings):
    """Under the packed Llama step (which the job compiles) the warm-up runs nothing and says
    why; finish() reports it and marks the wait as a start-up phase of the job."""
    engine_settings(decode_step="llama")
    outcome = {"rows": 2, "new_tokens": 16}
    decode_warmup.run(cuda_warmup.one_layer(base, CPU, native_norms=False), CPU, outcome)
    assert "only 'hf'" in outcome["error"] and "'llama'" in outcome["error"]


def test_finish_reports_the_warm_up_and_marks_its_wait(base, capsys, monkeypatch):
    monkeypatch.setattr(jobclock, "_MARKS", [])
    said = decode_warmup.finish(decode_warmup.launch(base, CPU, 4, 16), "readouts/x.parquet")
    assert "error" not in said and said["rows"] == 4
    assert [p for p, _ in jobclock._MARKS] == ["warm-up"]
    err = capsys.readouterr().err
    assert f"decode warm-up {said['s']:.2f} s at 4 rows x {decode_warmup.PROMPT_LEN}" in err


def test_a_warm_up_that_cannot_start_is_reported_not_raised(tmp_path, capsys):
    """A base without a config.json: the job goes on, and pays the first batch's start-up."""
    said = decode_warmup.finish(decode_warmup.launch(str(tmp_path), CPU, 4, 16))
    assert "config.json" in said["error"] or "OSError" in said["error"]
    assert "decode warm-up not done, the first batch pays it" in capsys.readouterr().err


def test_only_a_static_decode_on_cuda_is_warmed(repo_root, monkeypatch, engine_settings):
    """start() launches on the current CUDA device for the static engine only, unless turned
    off (CUDA faked present, launch recorded: this runs without a GPU)."""
    base = str(repo_root / "models/tiny-arith")
    launched = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(decode_warmup, "launch", lambda *a: launched.append(a) or "thread")
    engine_settings(decode_warmup=True)
    assert decode_warmup.start(base, 4, 16, "static") == "thread"
    assert launched == [(base, torch.device("cuda", 0), 4, 16)]
    assert decode_warmup.start(base, 4, 16, "hf") is None  # transformers' generate(): not ours
    engine_settings(decode_warmup=False)
    assert decode_warmup.start(base, 4, 16, "static") is None
    engine_settings(decode_warmup=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert decode_warmup.start(base, 4, 16, "static") is None
    assert len(launched) == 1


@pytest.mark.parametrize(
    "base,device",  # SmolLM2's geometry decodes in bf16 for a minute on 2 cores: CUDA only
    [("tiny", "cpu"), pytest.param("tiny", *CUDA.values, marks=CUDA.marks)]
    + [pytest.param("smollm2", *CUDA.values, marks=CUDA.marks)],
    indirect=["base"],
)
def test_the_warm_up_runs_beside_a_model_loading_onto_its_device(
    base, monkeypatch, engine_settings, device
):
    """Beside the main thread copying a model's weights to the device (what the job's load
    does), the warm-up finishes without error and compiles nothing, even where the job would
    compile decode's kernels (no plan yet: fused_kernels_on()); a decoder with CUDA graphs (on
    CUDA; none on CPU) on the loaded model then decodes greedy as one without graphs does."""
    from transformers import AutoConfig, AutoModelForCausalLM

    monkeypatch.setattr(decode_steps, "_planned_tokens", None)
    engine_settings(fused_decode="auto")
    assert decode_steps.fused_kernels_on()
    decode_steps._compiled_softmax.cache_clear()  # the compiled softmax, built on its first use
    dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else CPU
    thread = decode_warmup.launch(base, dev, 8, 16)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base))
    model = model.to(dev, torch.bfloat16).eval()
    said = decode_warmup.finish(thread)
    assert "error" not in said, said.get("error")
    assert decode_steps._compiled_softmax.cache_info().currsize == 0
    decode_steps.plan(8 * 16)  # the decoders below as a job this small runs them: not compiled
    ids = torch.randint(3, model.config.vocab_size, (8, 32), device=dev)
    mask = torch.ones_like(ids)
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=16)
    rows = decode.StaticDecoder(model, 8, 32, 16, dec, [-1], 0).run(ids, mask)
    eager = decode.StaticDecoder(model, 8, 32, 16, dec, [-1], 0, graphs=False).run(ids, mask)
    assert rows == eager
