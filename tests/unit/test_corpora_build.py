"""corpora.build end to end: decontamination and coverage selection recorded in stats.json."""

from __future__ import annotations

import json

import pytest

from arenaflow import manifest
from arenaflow.bases import tinymodel
from arenaflow.corpora import build as corpora
from arenaflow.pools import math as mathpool


@pytest.fixture(scope="module")
def tok():
    return tinymodel.build_tokenizer()


def test_rows_sharing_a_prompt_with_an_eval_item_are_dropped_and_named(tmp_path, tok):
    rows = mathpool.generate(20, 4, "train", {"add": 1, "mul": 1}, "t")
    leak = {"id": "eval-7", "prompt": rows[3]["prompt"]}
    stats = corpora.build(
        tmp_path / "c", rows, tok, "", {}, eval_items=[leak, {"id": "e2", "prompt": "unrelated"}]
    )
    rec = json.loads((tmp_path / "c/stats.json").read_text())["decontamination"]
    assert rec["dropped"] == 1 and rec["dropped_ids"] == [
        {"id": rows[3]["id"], "eval_id": "eval-7", "rule": "exact"}
    ]
    assert stats["rows"] == 19
    kept = [json.loads(x)["id"] for x in (tmp_path / "c/rows.jsonl").read_text().splitlines()]
    assert rows[3]["id"] not in kept
    manifest.verify(tmp_path / "c")


def test_coverage_selection_meets_group_minimums_under_a_row_budget(tmp_path, tok):
    rows = mathpool.generate(40, 6, "train", {"add": 8, "mul": 1}, "t")
    n_mul = sum(r["category"] == "mul" for r in rows)
    assert 2 <= n_mul < 10
    spec = {"row_budget": 10, "min_per_group": {"mul": n_mul}}
    stats = corpora.build(tmp_path / "c", rows, tok, "", {"coverage": spec})
    cov = stats["coverage"]
    assert stats["rows"] == 10 and cov["status"] == "Optimal"
    assert cov["per_group"]["mul"] == n_mul and cov["per_group"]["add"] == 10 - n_mul
    assert stats["rows_by_category"] == {"add": 10 - n_mul, "mul": n_mul}


def test_reference_policy_names_a_row_without_a_reference(tmp_path, tok):
    rows = mathpool.generate(3, 1, "train", {"add": 1}, "t")
    del rows[1]["reference"]
    with pytest.raises(ValueError, match=rf"{rows[1]['id']!r} has no 'reference'"):
        corpora.build(tmp_path / "c", rows, tok, "", {})
    assert not (tmp_path / "c").exists()


def test_a_group_below_its_minimum_keeps_all_its_rows_and_records_the_shortfall(tmp_path, tok):
    rows = mathpool.generate(30, 6, "train", {"add": 8, "mul": 1}, "t")
    n_mul = sum(r["category"] == "mul" for r in rows)
    stats = corpora.build(
        tmp_path / "c",
        rows,
        tok,
        "",
        {"coverage": {"row_budget": 12, "min_per_group": {"mul": n_mul + 5}}},
    )
    assert stats["coverage"]["per_group"]["mul"] == n_mul
    assert stats["coverage"]["min_shortfall"] == {"mul": 5}
