"""A base without a chat template, with `base.chat_template: chatml`, end to end on a tiny
random Llama: the ChatML tokens installed (tokenizer grown, embeddings resized), a LoRA arm that
trains the new rows (modules_to_save embed_tokens and lm_head) and a full arm trained through the
entry point, a bundle of the LoRA arm that ships ChatML, reloads with it and passes its checks,
and vLLM's verdict on that adapter: merged weights (it adds vocabulary, it trains whole
modules), which the bundle builds (merged: auto) at the grown vocabulary."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from hypers import TINY_LORA

from arenaflow import chat, io, models
from arenaflow.bundles import build as bundles
from arenaflow.corpora import build as corpora
from arenaflow.pools import math as mathpool
from arenaflow.servers import fit
from arenaflow.train import argv as train_argv

pytestmark = pytest.mark.dag  # two trainings through the entry point: ~1 min on 2 cores

SYSTEM = "You are a careful math tutor."
EOS = "<|endoftext|>"
TINY = Path(__file__).resolve().parents[2] / "models/tiny-arith"
# enough steps for the new rows to learn where a turn ends (the reload check wants a stop token)
LORA = {**TINY_LORA, "lora": {**TINY_LORA["lora"], "modules_to_save": ["embed_tokens", "lm_head"]}}
LORA |= {"max_steps": 24, "micro_batch_size": 4, "lr": 2e-3, "lm_head_lr": 2e-2}


def plain_base(out: Path) -> Path:
    """The embedded tiny model without ChatML: its byte-level tokenizer with an EOS and nothing
    else special, no chat template, and its weights cut to that vocabulary (the rows of ChatML's
    two tokens dropped), so the install must add the tokens, resize and train the new rows."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    raw = Tokenizer(tok_models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens([EOS])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=EOS, model_max_length=512)
    tok.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(TINY)
    assert models.load_tokenizer(TINY).convert_tokens_to_ids(EOS) == tok.eos_token_id
    model.resize_token_embeddings(len(tok))
    model.config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    return out


def train(root: Path, base: Path, arm: str, hyper: dict) -> Path:
    out = root / "runs" / arm / "final"
    cmd = train_argv(arm, hyper, root / "corpora/c", base, out, extra=["--corpus-id", "c"])
    proc = subprocess.run(
        [*cmd, "--chat-template", "chatml"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return out


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    root = tmp_path_factory.mktemp("install")
    base = plain_base(root / "base")
    tok = models.load_tokenizer(base, "chatml")
    rows = mathpool.generate(96, 5, "train", {"add": 1}, "in")
    corpora.build(root / "corpora/c", rows, tok, SYSTEM, {}, chat_template="chatml")
    return root, base


def test_the_base_has_no_template_and_chatml_installs_its_tokens(lineage):
    _, base = lineage
    assert models.load_tokenizer(base).chat_template is None
    tok = models.load_tokenizer(base, "chatml")
    assert len(tok) == len(models.load_tokenizer(base)) + 2
    assert {chat.IM_START, chat.IM_END} <= set(tok.get_vocab())


def test_a_full_arm_trains_on_the_installed_template(lineage):
    root, base = lineage
    out = train(root, base, "F", {**{k: v for k, v in TINY_LORA.items() if k != "lora"},
                                  "method": "full"})  # fmt: skip
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.get_input_embeddings().weight.shape[0] == len(models.load_tokenizer(base)) + 2


def test_a_lora_arm_s_bundle_ships_chatml_reloads_and_builds_merged_weights_for_vllm(lineage):
    root, base = lineage
    train(root, base, "A", LORA)
    out = root / "bundles/S"
    serving = {"max_input_tokens": 256, "max_new_tokens": 48, "do_sample": False}
    serving |= {"temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0}
    cfg = {"chat_template": "base", "system_prompt": SYSTEM, "serving": serving, "merged": "auto"}
    cfg["reload_prompts"] = ["Ann has 23 apples and gets 15 more. How many apples now?"]
    ns = dict(bundle="S", arm="A", nomination=None, lineage_json=json.dumps({"A": []}))
    ns |= dict(arms_json=None, runs=str(root / "runs"), corpora=str(root / "corpora"))
    ns |= dict(compare=[], base_model=str(base), bundle_json=json.dumps(cfg), out=str(out))
    bundles.build(argparse.Namespace(**ns, chat_template=None, base_chat_template="chatml"))
    checks = io.read_json(out / "checks.json")
    assert checks["reload"]["verdict"] == "RELOAD_CHECK_PASS", checks["reload"]
    assert checks["template_matches_renderer"]["verdict"] == "PASS"
    shipped = models.load_tokenizer(out)
    assert (
        shipped.chat_template == chat.CHATML_TEMPLATE == (out / "chat_template.jinja").read_text()
    )
    assert len(shipped) == len(models.load_tokenizer(base, "chatml"))
    facts = fit.adapter_facts(out, str(base))
    assert facts["added_tokens"] == 2 and facts["modules_to_save"] == ["embed_tokens", "lm_head"]
    served = io.read_json(out / "serving_config.json")["serving_engines"]["engines"]["vllm"]
    assert served["form"] == "merged" and served["use"] == "merged"
    verdict = fit.engine_verdict("vllm", facts)
    assert verdict["verdict"] == "merged weights needed"
    assert any("adds 2 tokens" in r for r in verdict["reasons"])
    assert any("modules_to_save" in r for r in verdict["reasons"])

    merged_check = io.read_json(out / "merged_check.json")
    assert merged_check["verdict"] == "PASS" and checks["merged"]["verdict"] == "PASS"
    assert all(r["adapter_ids"] == r["merged_ids"] for r in merged_check["prompts"])
    assert all(r["max_abs_logit_diff"] <= r["tolerance"] for r in merged_check["prompts"])
    reloaded_with_the_merged_vocabulary(out / "merged", shipped)


def reloaded_with_the_merged_vocabulary(merged: Path, shipped) -> None:
    """merged/ loads without PEFT or arenaflow, its vocabulary the bundle's tokenizer's, its two
    new rows the adapter's trained copies, and it generates with the shipped ChatML."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(merged)
    model = AutoModelForCausalLM.from_pretrained(merged).eval()
    n = len(shipped)
    assert len(tok) == n == io.read_json(merged / "config.json")["vocab_size"]
    assert model.get_input_embeddings().weight.shape[0] == n
    assert model.get_output_embeddings().weight.shape[0] == n
    saved = load_file(str(merged.parent / "adapter_model.safetensors"))
    for key, module in [("embed_tokens", model.get_input_embeddings()),
                        ("lm_head", model.get_output_embeddings())]:  # fmt: skip
        # PEFT serves the modules_to_save copy (it also saves the original beside it)
        (copy,) = [t for k, t in saved.items() if k.endswith(f".{key}.modules_to_save.weight")]
        assert torch.equal(module.weight, copy.to(module.weight.dtype)), key
    text = tok.apply_chat_template(
        chat.prompt_messages(SYSTEM, "Ann has 2 apples and gets 3 more. How many apples now?"),
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert tok.convert_tokens_to_ids(chat.IM_START) in ids[0].tolist()
    out = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1]
