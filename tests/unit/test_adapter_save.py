"""A trained LoRA adapter saved through train/model.save, its tensors handed to PEFT from one
host copy (model.host_copy), writes the files PEFT's own save_pretrained writes, byte for byte,
and reloads as a server would load it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from devices import CPU_AND_CUDA
from peft import LoraConfig, PeftModel, get_peft_model
from test_fused import TINY
from transformers import LlamaConfig, LlamaForCausalLM

from arenaflow.train import model as tmodel

REPO = Path(__file__).resolve().parents[2]
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY))


def trained(device, modules_to_save=None, lm_head_dtype=None):
    """A bf16 LoRA model whose adapter holds random weights (a fresh lora_B is all zeros)."""
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=PROJECTIONS, modules_to_save=modules_to_save
    )
    model = get_peft_model(base(), config).to(device, torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g))
    if lm_head_dtype is not None:  # a trained head kept in another dtype than the adapter
        for n, p in model.named_parameters():
            if "modules_to_save" in n:
                p.data = p.data.to(lm_head_dtype)
    return model


def files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"modules_to_save": ["lm_head"]},
        {"modules_to_save": ["lm_head"], "lm_head_dtype": torch.float32},
    ],
    ids=["lora", "lora+lm_head", "lora+fp32-lm_head"],
)
def test_the_files_are_peft_own_byte_for_byte(device, kwargs, tmp_path):
    model = trained(device, **kwargs)
    one_copy = tmodel.host_copy(model)
    assert one_copy, "the one-copy path was not taken"
    model.save_pretrained(str(tmp_path / "peft"), safe_serialization=True)
    if device == "cuda":  # as a training saves (on CPU it leaves PEFT to it)
        tmodel.save(None, model, tmp_path / "ours", rank=0, hyper={"method": "lora"}, stage=2)
    else:
        model.save_pretrained(str(tmp_path / "ours"), safe_serialization=True, **one_copy)
    ours = files(tmp_path / "ours")
    assert ours == files(tmp_path / "peft")
    assert set(ours) >= {"adapter_model.safetensors", "adapter_config.json"}

    served = PeftModel.from_pretrained(base(), str(tmp_path / "ours"))
    want = {n: p for n, p in model.named_parameters() if p.requires_grad}
    got = dict(served.named_parameters())
    assert want and all(torch.equal(got[n].to(p), p.cpu().to(p)) for n, p in want.items())


def test_peft_saves_by_itself_what_one_copy_would_not_cover(tmp_path):
    two = trained("cpu")
    two.add_adapter("other", LoraConfig(r=4, target_modules=["q_proj"]))
    assert tmodel.host_copy(two) == {}  # several adapters: PEFT picks the one to save

    frozen = trained("cpu")
    next(p for n, p in frozen.named_parameters() if "lora_A" in n).requires_grad_(False)
    assert tmodel.host_copy(frozen) == {}  # a frozen adapter weight is still saved, by PEFT
    tmodel.save(None, frozen, tmp_path / "ours", rank=0, hyper={"method": "lora"}, stage=2)
    frozen.save_pretrained(str(tmp_path / "peft"), safe_serialization=True)
    assert files(tmp_path / "ours") == files(tmp_path / "peft")

    assert tmodel.host_copy(base()) == {}  # a full model: transformers' save


def test_the_benchmark_compares_two_saves_of_the_same_bytes(tmp_path):
    """benchmarks/adapter_save.py, at two layers: it refuses to time saves that differ."""
    out = tmp_path / "save.json"
    cmd = [sys.executable, "adapter_save.py", "--cpu", "--layers", "2", "--reps", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    run = subprocess.run(
        [*cmd, "--out", str(out)],
        cwd=REPO / "benchmarks",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["same_bytes"] and result["adapter_tensors"] == 2 * 7 * 2
