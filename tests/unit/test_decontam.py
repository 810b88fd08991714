"""arenaflow.corpora.decontam: 30-token shingle overlap between training prompts and evaluation
items."""

from __future__ import annotations

import json

from arenaflow.corpora import decontam


def text(prefix: str, n: int) -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


EVAL_ITEM = text("e", 50)  # 50 distinct tokens
EVALS = [{"id": "ev-1", "prompt": text("z", 40)}, {"id": "ev-2", "prompt": EVAL_ITEM}]


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
        "train_rows": 3,
        "eval_items": 2,
        "kept": 2,
        "dropped": 1,
        "dropped_ids": [{"id": "t-2", "eval_id": "ev-2"}],
    }


def test_29_shared_tokens_are_not_a_collision_but_30_are():
    toks = EVAL_ITEM.split()
    near = {
        "id": "t-near",
        "prompt": " ".join(["x0", *toks[5:34], "x1", *text("c", 20).split()]),
    }  # 29 shared
    hit = {
        "id": "t-hit",
        "prompt": " ".join(["x0", *toks[5:35], "x1", *text("c", 20).split()]),
    }  # 30 shared
    kept, record = decontam.decontaminate([near, hit], EVALS)
    assert [r["id"] for r in kept] == ["t-near"]
    assert record["dropped_ids"] == [{"id": "t-hit", "eval_id": "ev-2"}]


def test_matching_ignores_case_and_spacing():
    toks = EVAL_ITEM.split()
    spaced = {"id": "t", "prompt": "\n".join(t.upper() for t in toks[:30])}
    kept, record = decontam.decontaminate([spaced], EVALS)
    assert kept == [] and record["dropped"] == 1


def test_short_prompts_collide_only_as_exact_duplicates():
    evals = [{"id": "ev-s", "prompt": "Ann has 23 apples and gets 15 more. How many apples now?"}]
    train = [
        {"id": "dup", "prompt": "ann has 23 apples and gets 15 more.  How many apples now?"},
        {"id": "other", "prompt": "Ann has 24 apples and gets 15 more. How many apples now?"},
        {
            "id": "longer",
            "prompt": "Ann has 23 apples and gets 15 more. How many apples now? Explain.",
        },
    ]
    kept, record = decontam.decontaminate(train, evals)
    assert [r["id"] for r in kept] == ["other", "longer"]
    assert record["dropped_ids"] == [{"id": "dup", "eval_id": "ev-s"}]


def test_other_eval_fields_can_be_shingled():
    evals = [{"id": "ev-r", "prompt": "short question", "reference": EVAL_ITEM}]
    train = [{"id": "t", "prompt": EVAL_ITEM}]
    assert decontam.decontaminate(train, evals)[1]["dropped"] == 0
    assert (
        decontam.decontaminate(train, evals, eval_fields=("prompt", "reference"))[1]["dropped"] == 1
    )


def test_first_colliding_eval_item_in_text_order_is_named():
    a, b = text("a", 30), text("b", 30)
    evals = [{"id": "ev-b", "prompt": b}, {"id": "ev-a", "prompt": a}]
    kept, record = decontam.decontaminate([{"id": "t", "prompt": f"{a} {b}"}], evals)
    assert record["dropped_ids"] == [{"id": "t", "eval_id": "ev-a"}]


def test_nothing_to_drop():
    kept, record = decontam.decontaminate([{"id": "t", "prompt": text("q", 80)}], EVALS)
    assert len(kept) == 1 and record["dropped"] == 0 and record["dropped_ids"] == []


def test_cli(tmp_path):
    train, evals = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    train.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [{"id": "t-1", "prompt": EVAL_ITEM}, {"id": "t-2", "prompt": text("k", 40)}]
        )
    )
    evals.write_text("".join(json.dumps(r) + "\n" for r in EVALS))
    out, rec = tmp_path / "kept.jsonl", tmp_path / "record.json"
    decontam.main(
        ["--train", str(train), "--eval", str(evals), "--out", str(out), "--record", str(rec)]
    )
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["t-2"]
    record = json.loads(rec.read_text())
    assert record["dropped"] == 1 and record["dropped_ids"] == [{"id": "t-1", "eval_id": "ev-2"}]
