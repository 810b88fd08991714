"""Verdicts by pool kind: math (gold), instruction following (constraints), open-ended."""

from __future__ import annotations

import pytest

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


def test_verdicts_spread_over_processes_are_the_serial_ones_in_order():
    """Math (math-verify, whose timeouts need a main thread), instruction and open rows mixed:
    four worker processes give the verdicts of one process, sample for sample."""
    pool = [
        {"id": "m", "gold": "\\frac{1}{2}"},
        {"id": "i", "constraints": [{"type": "no_char", "chars": ","}]},
        {"id": "o", "prompt": "write", "min_chars": 10},
    ]
    texts = ["The answer is $0.5$.", "The answer is \\boxed{1/2}", "no commas here.", "a, b", "x"]
    samples = [
        {**sample(t), "id": f"{p['id']}#{j}", "prompt_id": p["id"], "sample": j}
        for p in pool
        for j, t in enumerate(texts * 3)
    ]
    serial = candidates.verify_all(pool, samples, "s.jsonl")
    assert candidates.verify_all(pool, samples, "s.jsonl", workers=4) == serial
    assert [v["id"] for v in serial] == [s["id"] for s in samples]
    assert serial[0]["correct"] and serial[1]["correct"] and not serial[5 * 3 + 3]["correct"]
    with pytest.raises(ValueError, match=r"^s\.jsonl:2: prompt_id 'zz' is not in the pool"):
        candidates.verify_all(pool, [samples[0], {**samples[1], "prompt_id": "zz"}], "s.jsonl")
