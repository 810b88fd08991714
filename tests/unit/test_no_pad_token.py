"""A base whose tokenizer has no pad token (Llama 3, some GGUF imports): one place picks the
padding id (models.pad_id: the pad token, else EOS) and every path runs with it: training
collate and the SFT, DPO and SimPO objectives, sampling on both engines, readouts, a training
run through the entry point and a bundle built from it, whose tokenizer reloads as the base's."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from arenaflow import chat, io, models
from arenaflow.bases import tinymodel
from arenaflow.bundles import build as bundles
from arenaflow.decode import sampling
from arenaflow.evals import readout
from arenaflow.pools import math as mathpool
from arenaflow.train import data, objective

BASE = Path(__file__).resolve().parents[2] / "models/tiny-arith"

SYSTEM = tinymodel.SYSTEM_PROMPT
CONVERSATIONS = [
    chat.prompt_messages(SYSTEM, q) + [{"role": "assistant", "content": a}]
    for q, a in (
        (
            "Ann has 23 apples and gets 15 more. How many apples now?",
            "23 + 15 = 38. The answer is 38.",
        ),
        ("What is 7 * 6?", "42"),
        ("Cal had 81 coins and gave away 27. How many coins are left?", "81 - 27 = 54."),
    )
]
PROMPTS = [chat.render(c[:-1], add_generation_prompt=True) for c in CONVERSATIONS]


def encoded(tok) -> list[tuple[np.ndarray, np.ndarray]]:
    return [tuple(map(np.asarray, chat.encode_with_mask(tok, c))) for c in CONVERSATIONS]


@pytest.fixture(scope="module")
def nopad_base(tmp_path_factory, strip_pad):
    return strip_pad(BASE, tmp_path_factory.mktemp("bases") / "tiny-nopad")


@pytest.fixture(scope="module")
def base_model():
    return models.load_base(BASE).eval()


def test_pad_id_is_the_pad_token_else_eos_else_an_error_naming_the_tokenizer(
    tokenizer, nopad_tokenizer, nopad_base
):
    assert models.pad_id(tokenizer) == tokenizer.pad_token_id != tokenizer.eos_token_id
    assert models.pad_id(nopad_tokenizer) == nopad_tokenizer.eos_token_id
    reloaded = models.load_tokenizer(nopad_base)
    assert reloaded.pad_token is None and models.pad_id(reloaded) == reloaded.eos_token_id
    reloaded.eos_token = None
    with pytest.raises(ValueError, match=r"tiny-nopad: no pad token and no EOS token"):
        models.pad_id(reloaded)


def test_collate_pads_with_eos_and_still_supervises_each_real_eos(nopad_tokenizer):
    pad = models.pad_id(nopad_tokenizer)  # <|im_end|>: also the end of every assistant turn
    assert pad == nopad_tokenizer.convert_tokens_to_ids(chat.IM_END)
    rows = encoded(nopad_tokenizer)
    batch = data.collate(rows, [0, 1, 2], 256, pad)
    for i, (ids, mask) in enumerate(rows):
        n = len(ids)
        assert batch["input_ids"][i, n:].eq(pad).all() and not batch["attention_mask"][i, n:].any()
        assert batch["labels"][i, n:].eq(-100).all()
        last_eos = max(
            j for j, t in enumerate(ids) if t == pad
        )  # the assistant's closing <|im_end|>
        assert mask[last_eos] == 1 and batch["labels"][i, last_eos] == pad
    assert int(batch["labels"].eq(pad).sum()) == len(rows)  # those, and no padding
    assert data.supervised_tokens(rows, [0, 1, 2], 256) == int(
        batch["labels"][:, 1:].ne(-100).sum()
    )


def test_the_objectives_see_the_same_tokens_whatever_fills_the_padding(nopad_tokenizer, base_model):
    """SFT's summed NLL and the per-sequence log-probs DPO and SimPO compare are those of each
    row alone, whether padded with EOS or another id."""
    rows = encoded(nopad_tokenizer)
    eos = models.pad_id(nopad_tokenizer)
    with torch.no_grad():
        alone_nll = sum(
            objective.sft_sum(base_model, data.collate(rows, [i], 256, eos))[0] for i in range(3)
        )
        alone_lp = torch.cat(
            [
                objective.token_logprobs(base_model, data.collate(rows, [i], 256, eos))[0]
                for i in range(3)
            ]
        )
        for pad in (eos, 0):
            batch = data.collate(rows, [0, 1, 2], 256, pad)
            assert objective.sft_sum(base_model, batch)[0] == pytest.approx(
                float(alone_nll), rel=1e-5
            )
            assert torch.allclose(
                objective.token_logprobs(base_model, batch)[0], alone_lp, rtol=1e-5
            )
        chosen, rejected = (
            data.collate(rows, [0, 1], 256, eos),
            data.collate(rows, [2, 1], 256, eos),
        )
        ref = (
            objective.token_logprobs(base_model, chosen)[0],
            objective.token_logprobs(base_model, rejected)[0],
        )
        for hyper in (
            {"objective": "dpo", "beta": 0.1, "nll_weight": 0.1},
            {"objective": "simpo", "beta": 2.0, "simpo_gamma": 0.5, "nll_weight": 0.0},
        ):
            loss, _ = objective.preference_sum(base_model, chosen, rejected, ref, hyper)
            assert torch.isfinite(loss)
    assert float(
        objective.preference_sum(
            base_model, chosen, rejected, ref, {"objective": "dpo", "beta": 0.1, "nll_weight": 0.0}
        )[0].detach()
    ) == pytest.approx(2 * np.log(2))  # policy = ref


def test_sampling_without_a_pad_token_decodes_as_with_one_and_leaves_the_tokenizer_alone(
    nopad_base, base_model
):
    tok, nopad = models.load_tokenizer(BASE), models.load_tokenizer(nopad_base)
    side = nopad.padding_side
    greedy, sampled = (
        sampling.Decoding(max_new_tokens=24),
        sampling.Decoding(temperature=1.0, max_new_tokens=16),
    )
    for engine in ("hf", "static"):
        want = sampling.generate(base_model, tok, PROMPTS, greedy, batch_size=3, engine=engine)
        assert (
            sampling.generate(base_model, nopad, PROMPTS, greedy, batch_size=3, engine=engine)
            == want
        )
    want = sampling.generate(base_model, tok, PROMPTS, sampled, k=2, seed=3, batch_size=6)
    assert sampling.generate(base_model, nopad, PROMPTS, sampled, k=2, seed=3, batch_size=6) == want
    assert nopad.pad_token is None and nopad.padding_side == side


def test_a_readout_without_a_pad_token_reads_the_same_rows_and_shows_rows_rate_and_eta(
    nopad_base, tmp_path, capsys
):
    pool = tmp_path / "pool.jsonl"
    io.write_jsonl(
        pool,
        [
            {"id": f"q{i}", "category": "add", "prompt": c[1]["content"], "gold": "0"}
            for i, c in enumerate(CONVERSATIONS)
        ],
    )
    outs = {}
    for name, base in (("pad", BASE), ("nopad", nopad_base)):
        outs[name] = tmp_path / f"{name}.parquet"
        readout.main(
            [
                "readout",
                "--suite",
                "math",
                "--arm",
                "base",
                "--pool",
                str(pool),
                "--base-model",
                str(base),
                "--regime",
                "greedy",
                "--regime-json",
                json.dumps({"temperature": 0.0, "max_new_tokens": 24}),
                "--replicate",
                "0",
                "--seed",
                "0",
                "--batch-size",
                "2",
                "--system-prompt",
                SYSTEM,
                "--out",
                str(outs[name]),
            ]
        )
    pd.testing.assert_frame_equal(pd.read_parquet(outs["nopad"]), pd.read_parquet(outs["pad"]))
    err = capsys.readouterr().err
    assert "readout math/base/greedy.r0: 2/3 prompts x1 |" in err
    line = next(x for x in err.splitlines() if "3/3 prompts" in x)
    assert "tok/s" in line and "ETA 0s" in line


@pytest.fixture(scope="module")
def trained(tmp_path_factory, nopad_base, train_arm):
    root = tmp_path_factory.mktemp("lineage")
    rows = mathpool.generate(16, 5, "train", {"add": 1}, "np")
    return root, train_arm(root, nopad_base, rows, SYSTEM)


def test_training_without_a_pad_token_logs_rate_and_eta_and_streams_its_metrics(trained):
    root, proc = trained
    live = io.read_jsonl(root / "runs/A/metrics.jsonl")
    assert [m["step"] for m in live] == [1, 2]
    assert live == io.read_jsonl(root / "runs/A/final/metrics.jsonl")
    step = [x for x in proc.stderr.splitlines() if "step 2/2 |" in x]
    assert step and "tok/s" in step[0] and "ETA 0s" in step[0], proc.stderr[-3000:]


def test_a_bundle_of_a_base_without_a_pad_token_reloads_and_keeps_the_bases_tokenizer(
    trained, nopad_base
):
    root, _ = trained
    out = root / "bundles/S"
    cfg = {
        "chat_template": "chatml",
        "system_prompt": SYSTEM,
        "serving": {
            "max_input_tokens": 512,
            "max_new_tokens": 48,
            "do_sample": False,
            "temperature": 0.0,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
        },
        "reload_prompts": ["Ann has 23 apples and gets 15 more. How many apples now?"],
    }
    bundles.build(
        argparse.Namespace(
            bundle="S",
            arm="A",
            nomination=None,
            lineage_json=json.dumps({"A": []}),
            arms_json=None,
            runs=str(root / "runs"),
            corpora=str(root / "corpora"),
            compare=[],
            base_model=str(nopad_base),
            bundle_json=json.dumps(cfg),
            chat_template=None,
            base_chat_template="chatml",  # as the lineage was trained
            out=str(out),
        )
    )
    checks = io.read_json(out / "checks.json")
    assert checks["reload"]["verdict"] == "RELOAD_CHECK_PASS"
    assert checks["template_matches_renderer"]["verdict"] == "PASS"
    tok = models.load_tokenizer(out)
    assert tok.pad_token is None and "pad_token" not in io.read_json(out / "tokenizer_config.json")
    assert io.read_json(out / "generation_config.json")["pad_token_id"] == tok.eos_token_id
