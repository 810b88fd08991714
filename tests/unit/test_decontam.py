"""arenaflow.corpora.decontam: training prompts against evaluation items, on normalised tokens:
exact duplicates, 30-token shingles for long texts, words added or removed for short ones."""

from __future__ import annotations

import json

import pytest

from arenaflow.corpora import decontam
from arenaflow.pools import math as mathpool


def word(prefix: str, i: int) -> str:
    """A distinct all-letter word: digits would be tokens of their own."""
    out = ""
    while True:
        out = chr(ord("a") + i % 26) + out
        i //= 26
        if not i:
            return f"{prefix}{out}"


def text(prefix: str, n: int) -> str:
    return " ".join(word(prefix, i) for i in range(n))


EVAL_ITEM = text("e", 50)  # 50 distinct tokens
EVALS = [{"id": "ev-1", "prompt": text("z", 40)}, {"id": "ev-2", "prompt": EVAL_ITEM}]
SUM = "What is 12 + 7?"
WORDS = "Ann has 23 apples and gets 15 more. How many apples now?"  # the default's add template
SHORT = [{"id": "ev-sum", "prompt": SUM}, {"id": "ev-words", "prompt": WORDS}]


def dropped(train_prompts: list[str], evals: list[dict] = SHORT) -> list[dict]:
    train = [{"id": f"t-{i}", "prompt": p} for i, p in enumerate(train_prompts)]
    return decontam.decontaminate(train, evals)[1]["dropped_ids"]


@pytest.mark.parametrize(
    "evasion, prompt, rule",
    [
        ("prefix", "Question: What is 12 + 7?", "exact"),
        ("short prefix", "Q: what is 12 + 7?", "exact"),
        ("numbered prefix", "Problem 3: What is 12 + 7?", "exact"),
        ("list number", "1. What is 12 + 7?", "exact"),
        ("space before ?", "What is 12 + 7 ?", "exact"),
        ("no spaces", "What is 12+7?", "exact"),
        ("case", "WHAT IS 12 + 7?", "exact"),
        ("whitespace", "  What\tis\n\n12  +   7?  ", "exact"),
        ("fullwidth (NFKC)", "Ｗｈａｔ ｉｓ １２ ＋ ７？", "exact"),
        ("zero-width space", "Wh\u200bat is 12 + 7?", "exact"),
        ("word added", "What exactly is 12 + 7?", "subsequence"),
        ("words around it", "Hey, what is 12+7 now?", "subsequence"),
        ("word removed", "Ann has 23 apples and gets 15 more. How many apples?", "subsequence"),
        (
            "words added",
            "Ann has 23 apples and then gets 15 more. How many apples now, in all?",
            "subsequence",
        ),
        (
            "prefix, case and spacing",
            "Prompt: ANN has 23 apples and gets 15 more . How many apples now ?",
            "exact",
        ),
    ],
)
def test_each_evasion_of_a_short_eval_prompt_is_caught(evasion, prompt, rule):
    eval_id = "ev-words" if "apples" in prompt.lower() else "ev-sum"
    assert dropped([prompt]) == [{"id": "t-0", "eval_id": eval_id, "rule": rule}], evasion


def test_the_minus_sign_folds_to_the_hyphen_minus():
    assert dropped(["What is 12 \u2212 7?"], [{"id": "ev", "prompt": "what is 12 - 7"}]) == [
        {"id": "t-0", "eval_id": "ev", "rule": "exact"}
    ]


@pytest.mark.parametrize(
    "prompt",
    [
        "What is 12 + 8?",  # another number
        "What is 12 - 7?",  # another operator
        "What is 12 * 7?",
        "What is 7 + 12?",  # the numbers in another order
        "What is 112 + 7?",
        "What is 1.2 + 7?",
        "What is 12 + 7 + 1?",  # a number and an operator added
        "What is (12 + 7) * 2?",
        "Ann has 24 apples and gets 15 more. How many apples now?",
        "Ann has 23 apples and loses 15 more. How many apples now?",  # a word changed
        "Ann had 23 apples and gave away 15. How many apples are left?",  # the sub template
        "What is 12?",  # a number and an operator removed
    ],
)
def test_different_arithmetic_problems_are_not_a_match(prompt):
    assert dropped([prompt]) == []


def test_a_very_short_eval_prompt_does_not_claim_longer_prompts_that_contain_it():
    evals = [{"id": "ev", "prompt": "Tell me a joke."}]
    assert dropped(["Tell me a funny joke."], evals)[0]["rule"] == "subsequence"
    assert dropped(["Tell me a joke about my cat, please."], evals) == []


def test_the_defaults_training_pools_keep_every_row_and_its_disguised_eval_prompts_go():
    """The default's train and eval problems never share numbers and words in order; its eval
    prompts disguised (a prefix, spacing, case, a word added) are all caught."""
    evals = mathpool.generate(300, 99, "eval", {c: 1 for c in mathpool.CATEGORIES}, "math_eval")
    train = mathpool.generate(400, 11, "train", {c: 1 for c in mathpool.CATEGORIES}, "sft_s1")
    assert decontam.decontaminate(train, evals)[1]["dropped"] == 0
    disguised = [
        {"id": f"d-{i}", "prompt": f"Question: {e['prompt'].upper().replace('?', ' ?')} Thanks."}
        for i, e in enumerate(evals)
    ]
    kept, record = decontam.decontaminate(disguised, evals)
    assert kept == [] and record["dropped_by_rule"]["subsequence"] == 300


def test_planted_30_token_overlap_is_dropped_and_recorded():
    planted = " ".join(
        ["Some", "lead", "in", EVAL_ITEM.split(" ", 10)[-1].upper()]
    )  # e10..e49: 40 tokens
    train = [
        {"id": "t-1", "prompt": text("a", 60)},
        {"id": "t-2", "prompt": planted},
        {"id": "t-3", "prompt": text("b", 45)},
    ]
    kept, record = decontam.decontaminate(train, EVALS)
    assert [r["id"] for r in kept] == ["t-1", "t-3"]
    assert record == {
        "shingle_tokens": 30,
        "subsequence_max_growth": 1.5,
        "stripped_prefixes": sorted(decontam.PREFIXES),
        "train_rows": 3,
        "eval_items": 2,
        "kept": 2,
        "dropped": 1,
        "dropped_by_rule": {"exact": 0, "shingle": 1, "subsequence": 0},
        "dropped_ids": [{"id": "t-2", "eval_id": "ev-2", "rule": "shingle"}],
    }


def test_long_texts_need_30_shared_tokens_29_are_not_a_collision():
    toks = EVAL_ITEM.split()
    tail = text("c", 20).split()
    near = {"id": "t-near", "prompt": " ".join(["xa", *toks[5:34], "xb", *tail])}  # 29 shared
    hit = {"id": "t-hit", "prompt": " ".join(["xa", *toks[5:35], "xb", *tail])}  # 30 shared
    kept, record = decontam.decontaminate([near, hit], EVALS)
    assert [r["id"] for r in kept] == ["t-near"]
    assert record["dropped_ids"] == [{"id": "t-hit", "eval_id": "ev-2", "rule": "shingle"}]


def test_shingles_are_taken_on_normalised_tokens():
    toks = EVAL_ITEM.split()
    spaced = "Question: " + "\n".join(f"{t.upper()} ," for t in toks[:30])
    assert dropped([spaced], EVALS) == [{"id": "t-0", "eval_id": "ev-2", "rule": "shingle"}]


def test_tokens_keep_operators_and_drop_prose_punctuation():
    assert decontam.tokens("Q: what is 3+4 ?") == ["what", "is", "3", "+", "4"]
    assert decontam.tokens("3 + 4") != decontam.tokens("3 - 4")
    assert decontam.tokens("ﬁnd 3x, then 1.5 \u00d7 2.") == [
        "find",
        "3",
        "x",
        "then",
        "1.5",
        "*",
        "2",
    ]
    assert decontam.tokens("Question:") == ["question"]  # a label with nothing after it stays


def test_other_eval_fields_can_be_checked():
    evals = [{"id": "ev-r", "prompt": "short question", "reference": EVAL_ITEM}]
    train = [{"id": "t", "prompt": EVAL_ITEM}]
    assert decontam.decontaminate(train, evals)[1]["dropped"] == 0
    record = decontam.decontaminate(train, evals, eval_fields=("prompt", "reference"))[1]
    assert record["dropped_ids"] == [{"id": "t", "eval_id": "ev-r", "rule": "exact"}]


def test_first_colliding_eval_item_in_text_order_is_named():
    a, b = text("a", 30), text("b", 30)
    evals = [{"id": "ev-b", "prompt": b}, {"id": "ev-a", "prompt": a}]
    assert dropped([f"{a} {b}"], evals) == [{"id": "t-0", "eval_id": "ev-a", "rule": "shingle"}]


def test_nothing_to_drop():
    kept, record = decontam.decontaminate([{"id": "t", "prompt": text("q", 80)}], EVALS)
    assert len(kept) == 1 and record["dropped"] == 0 and record["dropped_ids"] == []


def test_a_row_without_its_text_is_refused_naming_the_source_and_row():
    train = [{"id": "t-1", "prompt": SUM}, {"id": "t-2", "prompt": None}]
    with pytest.raises(ValueError, match=r"^pools/p\.jsonl: row 2 \(id 't-2'\) has no text"):
        decontam.decontaminate(train, SHORT, source="pools/p.jsonl")


def test_cli(tmp_path):
    train, evals = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    rows = [
        {"id": "t-1", "prompt": EVAL_ITEM},
        {"id": "t-2", "prompt": text("k", 40)},
        {"id": "t-3", "prompt": "Question: what is 12+7 ?"},
    ]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals.write_text("".join(json.dumps(r) + "\n" for r in EVALS + SHORT))
    out, rec = tmp_path / "kept.jsonl", tmp_path / "record.json"
    decontam.main(
        ["--train", str(train), "--eval", str(evals), "--out", str(out), "--record", str(rec)]
    )
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["t-2"]
    record = json.loads(rec.read_text())
    assert record["dropped_ids"] == [
        {"id": "t-1", "eval_id": "ev-2", "rule": "exact"},
        {"id": "t-3", "eval_id": "ev-sum", "rule": "exact"},
    ]
    assert record["train"] == str(train) and record["eval"] == [str(evals)]
