"""arenaflow.corpora.build: pass@k, picking a verified sample, rejection sampling and
tokenisation."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction
from math import comb

import numpy as np
import pytest

from arenaflow import candidates, chat, io, manifest, verify
from arenaflow.corpora import build as corpora

SYSTEM = "You are a careful math tutor."


# --- pass@k -------------------------------------------------------------------------------


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of k-subsets of n samples (the first c correct) holding at least one correct."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_matches_closed_form_and_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            got = corpora.pass_at_k(n, c, k)
            assert got == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12), (n, c, k)
            assert got == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_closed_form_for_larger_n():
    for n, c, k in [(100, 3, 10), (64, 0, 8), (64, 64, 8), (200, 57, 100), (50, 1, 1)]:
        assert corpora.pass_at_k(n, c, k) == pytest.approx(
            1 - comb(n - c, k) / comb(n, k), rel=1e-12
        )


def test_pass_at_1_is_the_fraction_correct():
    assert corpora.pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


@pytest.mark.parametrize("n, c, k", [(4, 0, 8), (4, 2, 0), (4, 5, 1), (4, -1, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    # k > n has no unbiased estimate; before the guard (4, 0, 8) reported 1.0 for an unsolved prompt
    with pytest.raises(ValueError):
        corpora.pass_at_k(n, c, k)


# --- pick ---------------------------------------------------------------------------------


def _v(sample: int, chars: int) -> dict:
    return {"id": f"p#{sample}", "sample": sample, "chars": chars}


def test_pick_median_is_the_lower_median_by_length():
    vs = [_v(0, 40), _v(1, 10), _v(2, 30), _v(3, 20)]  # lengths sorted: 10 20 30 40
    assert corpora.pick(vs, "median", random.Random(0))["chars"] == 20
    vs = [_v(0, 40), _v(1, 10), _v(2, 30)]
    assert corpora.pick(vs, "median", random.Random(0))["chars"] == 30
    assert corpora.pick([_v(5, 7)], "median", random.Random(0))["sample"] == 5


def test_pick_shortest_and_longest():
    vs = [_v(0, 40), _v(1, 10), _v(2, 30), _v(3, 20)]
    assert corpora.pick(vs, "shortest", random.Random(0))["sample"] == 1
    assert corpora.pick(vs, "longest", random.Random(0))["sample"] == 0


def test_pick_breaks_length_ties_by_sample_index():
    vs = [_v(3, 10), _v(1, 10), _v(2, 10)]
    assert corpora.pick(vs, "shortest", random.Random(0))["sample"] == 1
    assert corpora.pick(vs, "median", random.Random(0))["sample"] == 2
    assert corpora.pick(vs, "longest", random.Random(0))["sample"] == 3


def test_pick_random_is_a_member_and_seeded():
    vs = [_v(i, 10 * i) for i in range(6)]
    picks = [corpora.pick(vs, "random", random.Random(s))["sample"] for s in range(20)]
    assert picks == [corpora.pick(vs, "random", random.Random(s))["sample"] for s in range(20)]
    assert set(picks) <= set(range(6)) and len(set(picks)) > 1


def test_pick_does_not_depend_on_input_order():
    vs = [_v(0, 40), _v(1, 10), _v(2, 30), _v(3, 20), _v(4, 25)]
    for how in ("median", "shortest", "longest"):
        a = corpora.pick(vs, how, random.Random(0))
        b = corpora.pick(list(reversed(vs)), how, random.Random(0))
        assert a == b


# --- select -------------------------------------------------------------------------------

POOL = [
    {
        "id": "p0",
        "prompt": "Ann has 3 apples and gets 4 more. How many apples now?",
        "gold": "7",
        "category": "add",
        "reference": "3 + 4 = 7. The answer is 7.",
    },
    {
        "id": "p1",
        "prompt": "Ben has 5 pens and gets 7 more. How many pens now?",
        "gold": "12",
        "category": "add",
        "reference": "5 + 7 = 12. The answer is 12.",
    },
    {
        "id": "p2",
        "prompt": "Cal buys 1 bag with 5 cups each. How many cups in all?",
        "gold": "5",
        "category": "mul",
        "reference": "1 * 5 = 5. The answer is 5.",
    },
]

# (text, stopped) per sample; comments say whether candidates.verdict calls it `correct`
SAMPLES = {
    "p0": [
        ("The answer is 7.", True),  # correct, 16 chars
        ("The answer is 8.", True),  # wrong
        ("3 + 4 = 7. The answer is 7.", True),  # correct, 27 chars
        ("3 + 4 = 7. So the answer is 7", False),  # right answer, did not stop: not correct
    ],
    "p1": [
        ("The answer is 12.\ufffd", True),  # U+FFFD: not correct
        ("   ", True),  # empty
        ("The answer is 13.", True),  # wrong
        ("The answer is 12.", False),  # did not stop
    ],
    "p2": [
        ("1 * 5 = 5. The answer is 5.", True),  # correct, 27
        ("The answer is 5.", True),  # correct, 16
        ("We have 1 bag of 5, so 5 cups. The answer is 5.", True),  # correct, 48
        ("5", True),  # correct, 1
    ],
}


def fake_samples() -> list[dict]:
    rows = []
    for pid, items in SAMPLES.items():
        for j, (text, stopped) in enumerate(items):
            rows.append(
                {
                    "id": f"{pid}#{j}",
                    "prompt_id": pid,
                    "sample": j,
                    "text": text,
                    "n_tokens": len(text),
                    "stopped": stopped,
                }
            )
    return rows


def fake_verdicts(samples: list[dict]) -> list[dict]:
    rows = {r["id"]: r for r in POOL}
    return [candidates.verdict(s, rows[s["prompt_id"]]) for s in samples]


def params(**over) -> dict:
    return {"k": 4, "seed": 0, "select": "median", "min_chars": 0, **over}


@pytest.fixture
def selected():
    samples = fake_samples()
    verdicts = fake_verdicts(samples)
    rows, stats = corpora.select(POOL, samples, verdicts, params())
    return samples, verdicts, rows, stats


def test_fake_verdicts_are_correct_where_intended():
    v = {x["id"]: x["correct"] for x in fake_verdicts(fake_samples())}
    assert [v[f"p0#{j}"] for j in range(4)] == [True, False, True, False]
    assert [v[f"p1#{j}"] for j in range(4)] == [False] * 4
    assert [v[f"p2#{j}"] for j in range(4)] == [True] * 4


def test_select_keeps_at_most_one_row_per_prompt(selected):
    _, _, rows, _ = selected
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids))
    assert set(ids) == {"p0", "p2"}


def test_select_never_keeps_a_sample_that_is_not_correct(selected):
    samples, verdicts, rows, _ = selected
    correct = {v["id"] for v in verdicts if v["correct"]}
    text = {s["id"]: s["text"] for s in samples}
    for r in rows:
        assert r["source"] in correct
        assert r["completion"] == text[r["source"]]


def test_select_picks_the_median_length_correct_sample(selected):
    _, _, rows, _ = selected
    by_id = {r["id"]: r for r in rows}
    # p0: correct lengths 16, 27 -> lower median 16; p2: 1, 16, 27, 48 -> lower median 16
    assert by_id["p0"]["completion"] == "The answer is 7."
    assert by_id["p2"]["completion"] == "The answer is 5."


def test_select_counts_unsolved_prompts_and_pass_rates(selected):
    _, _, _, stats = selected
    assert stats["prompts"] == 3
    assert stats["solved"] == 2
    assert stats["unsolved_dropped"] == 1
    assert stats["below_min_chars_dropped"] == 0
    # c/n per prompt: 2/4, 0/4, 4/4
    assert stats["pass_at_1"] == pytest.approx((2 / 4 + 0 + 1) / 3)
    # pass@4 with n = 4: 1 if any correct
    assert stats["pass_at_4"] == pytest.approx(2 / 3)
    assert stats["k"] == 4


def test_select_pass_at_k_for_k_below_n():
    samples = fake_samples()
    _, stats = corpora.select(POOL, samples, fake_verdicts(samples), params(k=2))
    # p0: 1 - C(2,2)/C(4,2) = 5/6; p1: 0; p2: 1
    assert stats["pass_at_2"] == pytest.approx((5 / 6 + 0 + 1) / 3)


def test_select_min_chars_drops_short_samples_and_counts_them():
    samples = fake_samples()
    rows, stats = corpora.select(POOL, samples, fake_verdicts(samples), params(min_chars=20))
    by_id = {r["id"]: r["completion"] for r in rows}
    assert by_id == {"p0": "3 + 4 = 7. The answer is 7.", "p2": "1 * 5 = 5. The answer is 5."}
    rows, stats = corpora.select(POOL, samples, fake_verdicts(samples), params(min_chars=30))
    assert [r["id"] for r in rows] == ["p2"]
    assert stats["solved"] == 2 and stats["below_min_chars_dropped"] == 1
    assert stats["pass_at_1"] == pytest.approx(0.5)  # min_chars does not change pass rates


def test_select_shortest_and_longest():
    samples = fake_samples()
    verdicts = fake_verdicts(samples)
    rows, _ = corpora.select(POOL, samples, verdicts, params(select="longest"))
    assert {r["id"]: r["source"] for r in rows} == {"p0": "p0#2", "p2": "p2#2"}
    rows, _ = corpora.select(POOL, samples, verdicts, params(select="shortest"))
    assert {r["id"]: r["source"] for r in rows} == {"p0": "p0#0", "p2": "p2#3"}


def test_select_rows_carry_prompt_and_hashes(selected):
    _, _, rows, _ = selected
    prompts = {r["id"]: r for r in POOL}
    for r in rows:
        assert r["prompt"] == prompts[r["id"]]["prompt"]
        assert r["category"] == prompts[r["id"]]["category"]
        assert r["prompt_sha256"] == manifest.sha256_text(r["prompt"])
        assert r["completion_sha256"] == manifest.sha256_text(r["completion"])


def test_select_fails_for_a_prompt_without_samples():
    samples = [s for s in fake_samples() if s["prompt_id"] != "p1"]
    with pytest.raises(ValueError, match="'p1'"):
        corpora.select(POOL, samples, fake_verdicts(samples), params())


def test_reference_uses_the_worked_solution():
    rows, stats = corpora.reference(POOL)
    assert [r["completion"] for r in rows] == [r["reference"] for r in POOL]
    assert all(r["source"] == "reference" for r in rows)
    assert stats == {"prompts": 3}


# --- tokenize -----------------------------------------------------------------------------


def test_tokenize_masks_only_assistant_content_and_im_end(tokenizer):
    rows, _ = corpora.reference(POOL)
    arrays, tstats = corpora.tokenize(rows, tokenizer, SYSTEM)
    ids, mask, off = arrays["input_ids"], arrays["loss_mask"], arrays["offsets"]
    assert off[0] == 0 and off[-1] == len(ids) == len(mask) and len(off) == len(rows) + 1
    for i, r in enumerate(rows):
        seg_ids, seg_mask = ids[off[i] : off[i + 1]], mask[off[i] : off[i + 1]]
        msgs = chat.prompt_messages(SYSTEM, r["prompt"]) + [
            {"role": "assistant", "content": r["completion"]}
        ]
        assert tokenizer.decode(seg_ids.tolist()) == chat.render(msgs)
        supervised = tokenizer.decode(seg_ids[seg_mask == 1].tolist())
        assert supervised == r["completion"] + "<|im_end|>"
    assert tstats["tokens"] == len(ids)
    assert tstats["supervised_tokens"] == int(mask.sum())
    assert tstats["mean_completion_chars"] == pytest.approx(
        np.mean([len(r["completion"]) for r in rows])
    )


def test_tokenize_without_system_prompt_has_no_system_turn(tokenizer):
    rows, _ = corpora.reference(POOL[:1])
    arrays, _ = corpora.tokenize(rows, tokenizer, "")
    text = tokenizer.decode(arrays["input_ids"].tolist())
    assert text.startswith("<|im_start|>user\n") and "system" not in text


def test_build_writes_a_corpus_whose_manifest_verifies(tmp_path, tokenizer):
    samples = fake_samples()
    out = tmp_path / "corpora" / "rft"
    stats = corpora.build(out, POOL, tokenizer, SYSTEM, params(), samples, fake_verdicts(samples))
    assert manifest.verify(out)["digest"] == stats["digest"]
    assert [r["id"] for r in io.read_jsonl(out / "rows.jsonl")] == ["p0", "p2"]
    assert stats["rows"] == 2 and stats["rows_by_category"] == {"add": 1, "mul": 1}
    assert io.read_json(out / "stats.json")["verifier"] == verify.verifier()  # math pool
    with np.load(out / "sft.npz") as z:
        assert z["offsets"][-1] == len(z["input_ids"]) == stats["tokens"]


def test_build_with_no_surviving_rows_fails_and_writes_nothing(tmp_path, tokenizer):
    samples = [s for s in fake_samples() if s["prompt_id"] == "p1"]
    out = tmp_path / "corpora" / "empty"
    with pytest.raises(ValueError, match="no rows survived"):
        corpora.build(out, POOL[1:2], tokenizer, SYSTEM, params(), samples, fake_verdicts(samples))
    assert not out.exists()
