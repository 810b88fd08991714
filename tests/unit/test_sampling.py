"""Batched generation: seeded reproducibility, stop detection, k samples per prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from arenaflow import chat, models
from arenaflow.bases import tinymodel
from arenaflow.decode import sampling

BASE = Path(__file__).resolve().parents[2] / "models/tiny-arith"
PROMPTS = [
    chat.render(chat.prompt_messages(tinymodel.SYSTEM_PROMPT, p), True)
    for p in (
        "Ann has 23 apples and gets 15 more. How many apples now?",
        "Ben buys 4 bags with 6 cards each. How many cards in all?",
        "Cal had 81 coins and gave away 27. How many coins are left?",
    )
]


@pytest.fixture(scope="module")
def policy():
    return models.load_policy(BASE, None)


def test_same_seed_gives_identical_samples_and_another_seed_differs(policy):
    model, tok = policy
    dec = sampling.Decoding(temperature=1.0, max_new_tokens=24)
    a = sampling.generate(model, tok, PROMPTS, dec, k=4, seed=7, batch_size=12)
    b = sampling.generate(model, tok, PROMPTS, dec, k=4, seed=7, batch_size=12)
    c = sampling.generate(model, tok, PROMPTS, dec, k=4, seed=8, batch_size=12)
    assert a == b
    assert a != c
    assert [len(s) for s in a] == [4, 4, 4]


def test_greedy_is_batch_independent_and_stops_on_im_end(policy):
    model, tok = policy
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=48)
    together = sampling.generate(model, tok, PROMPTS, dec, batch_size=8)
    alone = [sampling.generate(model, tok, [p], dec, batch_size=1)[0] for p in PROMPTS]
    assert [s[0]["text"] for s in together] == [s[0]["text"] for s in alone]
    for (s,) in together:
        assert s["stopped"] and "<|im_end|>" not in s["text"]


def test_a_cap_below_the_answer_length_is_reported_as_not_stopped(policy):
    model, tok = policy
    out = sampling.generate(model, tok, PROMPTS[:1], sampling.Decoding(max_new_tokens=3))
    assert out[0][0]["n_tokens"] == 3 and not out[0][0]["stopped"]


def test_a_static_batch_reports_where_its_time_went(policy, capsys):
    """Each batch's progress line (one a batch) ends with the static decoder's timing: the set-up
    (decoder built and made ready), the prompt pass and the decode steps, which add up to the
    batch; the steps are as many as the longest row needed, at most max_new_tokens - 1 (the
    prompt pass chooses the first token), and at most SYNC_EVERY - 1 past the last row's stop."""
    import re

    from arenaflow.decode.static import SYNC_EVERY as SYNC

    model, tok = policy
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=40)
    out = sampling.generate(model, tok, PROMPTS, dec, batch_size=2, engine="static")
    pattern = (
        r"\| batch ([\d.]+)s: set-up ([\d.]+)s \(ready ([\d.]+)s\), prompt pass ([\d.]+)s, "
        r"(\d+) steps ([\d.]+)s$"
    )
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "prompts x1" in ln]
    assert len(lines) == 2 and all("| ETA " in ln for ln in lines)  # benchmarks read up to here
    for line, rows in zip(lines, (out[:2], out[2:])):
        batch, setup, ready, prompt, steps, steps_s = re.search(pattern, line).groups()
        assert float(setup) + float(prompt) + float(steps_s) == pytest.approx(
            float(batch), abs=0.02
        )
        assert float(ready) <= float(setup) + 0.01
        longest = max(s["n_tokens"] for (s,) in rows)
        assert longest - 1 <= int(steps) <= min(dec.max_new_tokens - 1, longest - 1 + SYNC - 1)


def test_transformers_generate_reports_no_decoder_timing(policy, capsys):
    model, tok = policy
    sampling.generate(model, tok, PROMPTS[:1], sampling.Decoding(max_new_tokens=4), engine="hf")
    (line,) = [ln for ln in capsys.readouterr().err.splitlines() if "prompts x1" in ln]
    assert line.endswith("ETA 0s")
