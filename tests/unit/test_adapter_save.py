"""A training's final adapter save (train/model.save_adapter) writes the two files PEFT's
save_pretrained writes, byte for byte, from the parameters adapter_plan matched at set-up; and
benchmarks/adapter_save.py, which times the saves, compares only saves of the same bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from devices import CPU_AND_CUDA
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from arenaflow import models
from arenaflow.schema import hyper_defaults
from arenaflow.train import model as tmodel
from arenaflow.train.speed import lora_fused, lora_grouped

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "models/tiny-arith"
FILES = models.ADAPTER_FILES
LORA = {"r": 4, "alpha": 8, "dropout": 0.0}


def as_deepspeed_holds_them(net) -> None:
    """Random adapter weights (a fresh lora_B is zeros), then every trainable parameter made a
    view of one flat buffer, as ZeRO-1/2's bf16 groups hold them."""
    params = [p for p in net.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g))
    flat = _flatten_dense_tensors([p.data for p in params])
    for p, view in zip(params, _unflatten_dense_tensors(flat, [p.data for p in params])):
        p.data = view


def saved_both_ways(net, tmp_path: Path) -> tuple[Path, Path]:
    plan = tmodel.adapter_plan(net)
    assert plan is not None
    as_deepspeed_holds_them(net)
    net.save_pretrained(str(tmp_path / "peft"), safe_serialization=True)
    tmodel.save(None, net, tmp_path / "ours", 0, {"method": "lora"}, 2, plan)
    return tmp_path / "peft", tmp_path / "ours"


def assert_same_files(peft: Path, ours: Path) -> None:
    """PEFT's bytes, but target_modules (a set) written sorted: PEFT writes its iteration
    order, which changes with the process's string hashing."""
    assert sorted(p.name for p in ours.iterdir()) == sorted(FILES)  # no model card
    for name in FILES:
        if name != models.ADAPTER_CONFIG:
            assert (ours / name).read_bytes() == (peft / name).read_bytes(), name
    theirs = json.loads((peft / models.ADAPTER_CONFIG).read_text())
    text = (ours / models.ADAPTER_CONFIG).read_text()
    assert json.loads(text)["target_modules"] == sorted(theirs["target_modules"])
    want = {**theirs, "target_modules": sorted(theirs["target_modules"])}
    assert text == json.dumps(want, indent=2, sort_keys=True)  # PEFT's layout


@pytest.mark.parametrize(
    "lora",
    [
        {"target_modules": ["q_proj", "v_proj"]},
        {
            "target_modules": ["q_proj", "k_proj", "v_proj", "up_proj"],
            "modules_to_save": ["lm_head"],
        },
    ],
    ids=["q-v", "qkv-up-lm_head"],
)
@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_the_adapter_is_saved_as_peft_saves_it_and_reloads(lora, device, tmp_path):
    hyper = {**hyper_defaults(), "method": "lora", "lora": {**LORA, **lora}}
    net = tmodel.build(str(BASE), "base", hyper)
    if device == "cuda":  # as a job holds them: bf16 on the GPU, which safetensors copies back
        net.to(device, torch.bfloat16)
    lora_fused.fuse(net)  # the module tree as a job saves it: fused, then grouped
    lora_grouped.group(net)
    peft, ours = saved_both_ways(net, tmp_path)
    assert_same_files(peft, ours)
    from peft import PeftModel

    back = PeftModel.from_pretrained(models.from_pretrained(BASE), str(ours))
    want = {n: p for n, p in net.named_parameters() if p.requires_grad}
    got = dict(back.named_parameters())
    assert want and all(torch.equal(got[n], p.cpu().to(got[n].dtype)) for n, p in want.items())


def test_an_adapter_that_peft_would_write_otherwise_goes_through_peft(tmp_path):
    """No task type: PEFT writes the base's class into the config (auto_mapping), which the
    direct save does not know; such an adapter has no plan and is saved by PEFT itself."""
    from peft import get_peft_model

    hyper = {"method": "lora"}
    config = tmodel.lora_config({**LORA, "target_modules": ["q_proj", "v_proj"]})
    config.task_type = None
    net = get_peft_model(models.from_pretrained(BASE), config)
    assert tmodel.adapter_plan(net) is None
    assert tmodel.adapter_plan(models.from_pretrained(BASE)) is None  # full weights
    tmodel.save(None, net, tmp_path / "out", 0, hyper, 2, None)
    cfg = json.loads((tmp_path / "out" / models.ADAPTER_CONFIG).read_text())
    assert cfg["auto_mapping"]["base_model_class"] == "LlamaForCausalLM"
    assert (tmp_path / "out" / "README.md").is_file()  # PEFT's model card: PEFT's own save


def test_the_benchmark_compares_saves_of_the_same_bytes(tmp_path):
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
    assert set(result["median_s"]) == {"peft", "one_copy", "arenaflow"}
