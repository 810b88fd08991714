"""A base of the user's own architecture: LoRA targets in its own naming (or all-linear), partial
rotary embeddings (GPT-NeoX's rotary_pct, Phi-3's partial_rotary_factor) kept on the model's own
code in training and decoding, and a PEFT adapter directory given as the base refused by name,
without the Hugging Face Hub. Tiny random models built here (hidden 32, 2 layers)."""

from __future__ import annotations

import json
import socket
import sys

import pytest
import torch
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
)

from arenaflow import models
from arenaflow.bases import tinymodel
from arenaflow.decode import llamastep, sampling
from arenaflow.decode import static as decode
from arenaflow.decode import steps as decode_steps
from arenaflow.train import model as tmodel
from arenaflow.train.speed import rope

SIZES = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def tiny(family: str, vocab: int = 96):
    torch.manual_seed(0)
    extra = {"max_position_embeddings": 256, "vocab_size": vocab, "pad_token_id": 0}
    extra |= {"bos_token_id": 1, "eos_token_id": 2}
    if family == "gpt_neox":  # Pythia's shape: a quarter of each head rotated
        return GPTNeoXForCausalLM(GPTNeoXConfig(**SIZES, **extra, rotary_pct=0.25)).eval()
    if family == "phi3":  # Phi-4-mini's shape: partial_rotary_factor below 1
        return Phi3ForCausalLM(Phi3Config(**SIZES, **extra, partial_rotary_factor=0.5)).eval()
    return LlamaForCausalLM(LlamaConfig(**SIZES, **extra)).eval()


def test_partial_rotary_is_named_and_keeps_the_models_own_function():
    for family, key in (("gpt_neox", "partial_rotary_factor 0.25"), ("phi3", "0.5")):
        net = tiny(family)
        assert key in models.partial_rotary(net)
        module = sys.modules[type(net).__module__]
        own = module.apply_rotary_pos_emb
        assert rope.install(net) == 0 and module.apply_rotary_pos_emb is own
        assert llamastep.unsupported(net)
    assert models.partial_rotary(tiny("llama")) is None


def test_a_llama_with_a_partial_rotary_keeps_transformers_decode_step():
    net = tiny("llama")
    net.config.rope_parameters = {**net.config.rope_parameters, "partial_rotary_factor": 0.5}
    assert "partial_rotary_factor 0.5" in llamastep.unsupported(net)
    assert decode_steps.step_kind(net, "auto") == "hf"
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        decode_steps.step_kind(net, "llama")


@pytest.mark.parametrize("family", ["gpt_neox", "phi3"])
def test_greedy_decoding_of_a_partial_rotary_model_equals_generate(family):
    net = tiny(family)
    assert decode_steps.step_kind(net, "auto") == "hf"
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 96, (3, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    ids[0, :3] = 0
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=12)
    want = net.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=12,
        eos_token_id=[2],
        pad_token_id=0,
        **dec.generate_kwargs(),
    )[:, ids.shape[1] :].tolist()
    got = decode.StaticDecoder(net, *ids.shape, 12, dec, [2], 0).run(ids, mask)
    cut = [r[: r.index(2) + 1] if 2 in r else r for r in want]
    assert [r[: len(c)] for r, c in zip(got, cut)] == cut


LORA = {"r": 4, "alpha": 8, "dropout": 0.0}


def adapted_names(adapted) -> set[str]:
    return {
        n.split(".lora_A")[0].rsplit(".", 1)[-1]
        for n, _ in adapted.named_parameters()
        if "lora_A" in n
    }


@pytest.mark.parametrize(
    ("family", "targets"),
    [("phi3", ["qkv_proj", "gate_up_proj"]), ("gpt_neox", ["query_key_value", "dense_4h_to_h"])],
)
def test_lora_takes_the_architectures_own_names(family, targets):
    net = tiny(family)
    lora = {**LORA, "target_modules": targets}
    tmodel.check_targets(net, lora, "arm A", "base")
    from peft import get_peft_model

    adapted = get_peft_model(net, tmodel.lora_config(lora))
    assert adapted_names(adapted) == set(targets)


def test_all_linear_adapts_every_linear_layer_but_the_output_head():
    from peft import get_peft_model

    net = tiny("phi3")
    lora = {**LORA, "target_modules": ["all-linear"]}
    tmodel.check_targets(net, lora, "arm A", "base")
    adapted = get_peft_model(net, tmodel.lora_config(lora))
    assert adapted_names(adapted) == set(tmodel.linear_names(tiny("phi3"))) - {"lm_head"}
    with pytest.raises(SystemExit, match="stands alone"):
        tmodel.check_targets(net, {**LORA, "target_modules": ["all-linear", "qkv_proj"]}, "a", "b")


def test_a_target_the_base_lacks_is_refused_naming_the_arm_and_its_linear_layers():
    with pytest.raises(SystemExit) as e:
        tmodel.check_targets(
            tiny("phi3"),
            {**LORA, "target_modules": ["q_proj", "qkv_proj"]},
            "arm B (arms/B.yaml)",
            "models/phi",
        )
    msg = str(e.value)
    assert "arm B (arms/B.yaml)" in msg and "['q_proj']" in msg and "Phi3ForCausalLM" in msg
    assert "['down_proj', 'gate_up_proj', 'lm_head', 'o_proj', 'qkv_proj']" in msg


def test_fused_moe_experts_are_named_as_parameters_target_modules_cannot_adapt():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    moe = Qwen3MoeConfig(
        **SIZES, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, vocab_size=96
    )
    net = Qwen3MoeForCausalLM(moe)
    lora = {**LORA, "target_modules": ["q_proj", "gate_up_proj"]}
    with pytest.raises(SystemExit) as e:
        tmodel.check_targets(net, lora, "arm M", "models/moe")
    msg = str(e.value)
    assert "['gate_up_proj'] name no module" in msg
    assert "model.layers.0.mlp.experts.gate_up_proj ... are parameters of fused experts" in msg


def test_a_peft_adapter_directory_as_the_base_is_refused_without_the_hub(tmp_path, monkeypatch):
    adapter = tmp_path / "my-adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps(
            {"base_model_name_or_path": "microsoft/Phi-4-mini-instruct", "peft_type": "LORA"}
        )
    )
    (adapter / "adapter_model.safetensors").write_bytes(b"")

    def no_network(*a, **k):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(ValueError) as e:
        models.load_base(adapter)
    msg = str(e.value)
    assert f"{adapter} is a PEFT adapter (adapter_config.json)" in msg
    assert "'microsoft/Phi-4-mini-instruct'" in msg and "not a model" in msg


@pytest.fixture(scope="module")
def own_bases(tmp_path_factory):
    """Tiny partial-rotary models saved as base directories with tiny-arith's tokenizer."""
    tok = tinymodel.build_tokenizer()
    out = {}
    for family in ("gpt_neox", "phi3"):
        d = tmp_path_factory.mktemp(family)
        tiny(family, vocab=len(tok)).save_pretrained(d)
        tok.save_pretrained(d)
        out[family] = d
    return out


@pytest.mark.ranks  # two trainings through the entry point: ~13 s of CPU each
@pytest.mark.parametrize(
    ("family", "targets"), [("gpt_neox", ["query_key_value"]), ("phi3", ["qkv_proj"])]
)
def test_a_partial_rotary_base_trains_lora_on_its_own_rotary_code(
    family, targets, own_bases, train_arm, tmp_path
):
    from arenaflow.pools import math as mathpool

    rows = mathpool.generate(8, 3, "train", {"add": 1}, "t")
    lora = {**LORA, "target_modules": targets}
    proc = train_arm(tmp_path, own_bases[family], rows, tinymodel.SYSTEM_PROMPT, lora=lora)
    assert "rotary embedding: the model's own code, as" in proc.stderr
    run = tmp_path / "runs/A/final"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)
    saved = json.loads((run / "adapter_config.json").read_text())
    assert saved["target_modules"] == targets
