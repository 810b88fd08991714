"""Verdicts by pool kind: math (gold), instruction following (constraints), open-ended."""

from __future__ import annotations

from arenaflow import candidates


def sample(text, stopped=True):
    return {
        "id": "p#0",
        "prompt_id": "p",
        "sample": 0,
        "text": text,
        "n_tokens": len(text),
        "stopped": stopped,
    }


def test_math_verdict_needs_a_loose_correct_answer_that_stopped():
    row = {"id": "p", "gold": "12"}
    assert candidates.verdict(sample("5 + 7 = 12. The answer is 12."), row)["correct"]
    assert not candidates.verdict(sample("The answer is 12.", stopped=False), row)["correct"]
    assert not candidates.verdict(sample("The answer is 13."), row)["correct"]


def test_instruction_verdict_names_the_failed_check():
    row = {"id": "p", "constraints": [{"type": "no_char", "chars": ","}, {"type": "is_lower"}]}
    ok = candidates.verdict(sample("all lower case and no commas here."), row)
    assert ok["correct"] and ok["reasons"] == []
    bad = candidates.verdict(sample("Upper, and a comma."), row)
    assert not bad["correct"] and len(bad["reasons"]) == 2
    assert any("no_char" in r for r in bad["reasons"])


def test_open_verdict_rejects_loops_and_short_answers():
    row = {"id": "p", "prompt": "write", "min_chars": 40}
    good = "Rivers carve valleys over millennia, moving sediment toward the sea and shaping plains."
    assert candidates.verdict(sample(good), row)["correct"]
    assert not candidates.verdict(sample("Too short."), row)["correct"]
    loop = " ".join(["the same six words repeat forever"] * 12)
    v = candidates.verdict(sample(loop), row)
    assert v["loop"] and not v["correct"]
