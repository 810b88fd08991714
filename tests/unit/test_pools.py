"""arenaflow.pools.build: seeded synthetic problems, the train/eval partition and row validation."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from arenaflow import verify
from arenaflow.pools import build as pools
from arenaflow.pools import math as mathpool
from arenaflow.pools.exclude import Excluded, check_exclude
from arenaflow.pools.validate import ID_RE, validate_rows

ALL = {c: 1.0 for c in mathpool.CATEGORIES}


def key_of(row: dict) -> tuple:
    """The problem key recorded in a row's source ("synthetic:seed=S:key=cat/a/b[/c]")."""
    m = re.fullmatch(r"synthetic:seed=\d+:key=(.+)", row["source"])
    assert m, row["source"]
    cat, *nums = m.group(1).split("/")
    return (cat, *map(int, nums))


def expected_gold(key: tuple) -> int:
    cat, *n = key
    return {
        "add": lambda a, b: a + b,
        "sub": lambda a, b: a - b,
        "mul": lambda a, b: a * b,
        "two_step": lambda a, b, c: a + b - c,
    }[cat](*n)


@pytest.fixture(scope="module")
def train_rows():
    return mathpool.generate(300, seed=12, split="train", categories=ALL, prefix="math_r1")


@pytest.fixture(scope="module")
def eval_rows():
    return mathpool.generate(150, seed=99, split="eval", categories=ALL, prefix="math_eval")


def test_same_seed_gives_identical_rows(train_rows):
    assert (
        mathpool.generate(300, seed=12, split="train", categories=ALL, prefix="math_r1")
        == train_rows
    )


def test_different_seeds_give_different_rows(train_rows):
    other = mathpool.generate(300, seed=13, split="train", categories=ALL, prefix="math_r1")
    assert [r["prompt"] for r in other] != [r["prompt"] for r in train_rows]
    assert {key_of(r) for r in other} != {key_of(r) for r in train_rows}


def test_every_row_belongs_to_its_split(train_rows, eval_rows):
    assert all(mathpool.split_of(key_of(r)) == "train" for r in train_rows)
    assert all(mathpool.split_of(key_of(r)) == "eval" for r in eval_rows)


def test_train_and_eval_pools_never_share_a_problem(train_rows, eval_rows):
    more_train = mathpool.generate(
        300, seed=99, split="train", categories=ALL, prefix="t"
    )  # eval's seed
    train_keys = {key_of(r) for r in train_rows + more_train}
    eval_keys = {key_of(r) for r in eval_rows}
    assert train_keys.isdisjoint(eval_keys)
    assert {r["prompt"] for r in train_rows + more_train}.isdisjoint(
        {r["prompt"] for r in eval_rows}
    )


def test_split_of_partitions_about_one_key_in_five():
    keys = [("add", a, b) for a in range(10, 60) for b in range(10, 40)]  # the whole add space
    frac = sum(mathpool.split_of(k) == "eval" for k in keys) / len(keys)
    assert 0.15 < frac < 0.25


def test_split_of_does_not_depend_on_the_process_hash_seed():
    code = (
        "from arenaflow.pools import math as mathpool; "
        "print(''.join(mathpool.split_of(('two_step', a, 7, 3))[0] for a in range(10, 50)))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    here = "".join(mathpool.split_of(("two_step", a, 7, 3))[0] for a in range(10, 50))
    assert outs == {here}
    assert set(here) == {"t", "e"}


def test_keys_within_a_pool_are_distinct(train_rows):
    keys = [key_of(r) for r in train_rows]
    assert len(set(keys)) == len(keys)


def test_ids_are_unique_prefixed_and_sequential(train_rows):
    ids = [r["id"] for r in train_rows]
    assert len(set(ids)) == len(ids) == 300
    assert ids[0] == "math_r1-00000" and ids[-1] == "math_r1-00299"
    assert all(ID_RE.match(i) for i in ids)


def test_gold_is_the_arithmetic_of_the_key(train_rows, eval_rows):
    for r in train_rows + eval_rows:
        key = key_of(r)
        assert r["category"] == key[0]
        assert r["gold"] == str(expected_gold(key))
        for n in key[1:]:
            assert re.search(rf"\b{n}\b", r["prompt"]), (n, r["prompt"])


def test_reference_solution_verifies_against_gold(train_rows):
    for r in train_rows:
        assert verify.check(r["reference"], r["gold"])["strict"], r


def test_answers_are_positive(train_rows, eval_rows):
    assert all(int(r["gold"]) > 0 for r in train_rows + eval_rows)


def test_category_weights_restrict_the_categories():
    rows = mathpool.generate(40, seed=1, split="train", categories={"mul": 1.0}, prefix="m")
    assert {r["category"] for r in rows} == {"mul"}
    rows = mathpool.generate(
        200, seed=1, split="train", categories={"add": 1.0, "sub": 1.0}, prefix="m"
    )
    assert {r["category"] for r in rows} == {"add", "sub"}


def test_asking_for_more_distinct_problems_than_exist_fails():
    # mul has 8 * 11 = 88 keys, so at most 88 problems across both splits
    with pytest.raises(ValueError, match="could only draw"):
        mathpool.generate(89, seed=0, split="train", categories={"mul": 1.0}, prefix="m")


def test_unknown_split_is_rejected():
    with pytest.raises(ValueError, match="split must be"):
        mathpool.generate(5, seed=0, split="test", categories=ALL, prefix="x")


def test_generated_rows_validate(train_rows):
    validate_rows(train_rows, "pools/math_r1.jsonl")


def _rows():
    return [
        {"id": f"p-{i}", "prompt": f"q{i}", "gold": str(i), "category": "add"} for i in range(4)
    ]


def test_validate_rows_names_path_line_for_missing_id():
    rows = _rows()
    del rows[2]["id"]
    with pytest.raises(ValueError, match=r"^pools/x\.jsonl:3: missing or empty 'id'"):
        validate_rows(rows, "pools/x.jsonl")


def test_validate_rows_names_both_lines_for_duplicate_id():
    rows = _rows()
    rows[3]["id"] = "p-1"
    with pytest.raises(
        ValueError, match=r"^pools/x\.jsonl:4: duplicate id 'p-1' \(first on line 2\)"
    ):
        validate_rows(rows, "pools/x.jsonl")


@pytest.mark.parametrize("gold", [None, "", 5])
def test_validate_rows_names_path_line_for_missing_gold(gold):
    rows = _rows()
    rows[0]["gold"] = gold
    with pytest.raises(ValueError, match=r"^pools/x\.jsonl:1: missing or empty 'gold'"):
        validate_rows(rows, "pools/x.jsonl")


@pytest.mark.parametrize("bad", ["a/b", "../x", "-lead", "has space"])
def test_validate_rows_rejects_ids_that_could_escape_a_path(bad):
    rows = _rows()
    rows[1]["id"] = bad
    with pytest.raises(ValueError, match=r"^pools/x\.jsonl:2: id .* has characters outside"):
        validate_rows(rows, "pools/x.jsonl")


def test_build_uses_pool_id_as_prefix_and_params():
    rows = pools.build("sft_s1", {"n": 10, "seed": 11, "split": "train", "categories": ALL})
    assert rows == mathpool.generate(10, 11, "train", ALL, "sft_s1")


# --- exclude: a pool drawn fresh of other pools' prompts ---------------------------------


def test_a_pool_excluding_its_twin_shares_no_prompt_and_still_has_n_rows(train_rows):
    # same seed and categories: every candidate the twin kept comes first and is skipped
    exclude = Excluded(r["prompt"] for r in train_rows)
    rows = mathpool.generate(
        300, seed=12, split="train", categories=ALL, prefix="math_r2", exclude=exclude
    )
    assert len(rows) == 300
    assert {r["prompt"] for r in rows}.isdisjoint({r["prompt"] for r in train_rows})
    assert exclude.skipped >= 300
    assert [r["id"] for r in rows] == [f"math_r2-{i:05d}" for i in range(300)]
    assert all(mathpool.split_of(key_of(r)) == "train" for r in rows)
    validate_rows(rows, "pools/math_r2.jsonl")


def test_excluding_nothing_builds_the_pool_as_before(train_rows):
    exclude = Excluded()
    assert (
        mathpool.generate(
            300, seed=12, split="train", categories=ALL, prefix="math_r1", exclude=exclude
        )
        == train_rows
    )
    assert exclude.skipped == 0


def test_excluding_a_pool_with_no_shared_prompt_changes_nothing(train_rows):
    other = mathpool.generate(300, seed=13, split="train", categories=ALL, prefix="x")
    assert {r["prompt"] for r in other}.isdisjoint({r["prompt"] for r in train_rows})
    exclude = Excluded(r["prompt"] for r in train_rows)
    assert (
        mathpool.generate(300, seed=13, split="train", categories=ALL, prefix="x", exclude=exclude)
        == other
    )
    assert exclude.skipped == 0


def test_excluded_prompts_match_after_whitespace_normalisation():
    exclude = Excluded(["  Ann has 12 apples\n and gets  3 more.  "])
    assert exclude.hits("Ann has 12 apples and gets 3 more.")
    assert exclude.hits("Ann\thas 12 apples and gets 3\u00a0more.")  # any unicode whitespace
    assert not exclude.hits("ann has 12 apples and gets 3 more.")  # case is kept
    assert not exclude.hits("Ann has 12 apples and gets 3 more")  # punctuation is kept
    assert exclude.skipped == 0 and exclude.drops("Ann has 12 apples and gets 3 more.")
    assert exclude.skipped == 1


def test_build_passes_exclude_to_the_generator():
    params = {"n": 20, "seed": 4, "split": "train", "categories": ALL}
    first = pools.build("a", params)
    rows = pools.build("b", params, exclude=Excluded(r["prompt"] for r in first))
    assert len(rows) == 20 and {r["prompt"] for r in rows}.isdisjoint({r["prompt"] for r in first})


def test_exclusion_that_exhausts_the_problems_fails():
    mul = {"mul": 1.0}
    every = mathpool.generate(60, seed=0, split="train", categories=mul, prefix="m")
    exclude = Excluded(r["prompt"] for r in every)
    with pytest.raises(
        ValueError,
        match=r"could only draw \d+ of 300 distinct train problems \(\d+ skipped as excluded\)",
    ):
        mathpool.generate(300, seed=0, split="train", categories=mul, prefix="m", exclude=exclude)


def test_check_exclude_accepts_a_chain_of_rounds():
    cfg = {"r1": {}, "r2": {"exclude": ["r1"]}, "r3": {"exclude": ["r1", "r2"]}, "eval": {}}
    assert check_exclude(cfg) == []


def test_check_exclude_names_unknown_and_self():
    problems = check_exclude({"r1": {"exclude": ["r1", "r9"]}, "r2": {}})
    assert problems == [
        ("pools/r1/exclude", "pool 'r1' cannot exclude itself"),
        ("pools/r1/exclude", "unknown pool 'r9'; known: ['r1', 'r2']"),
    ]


@pytest.mark.parametrize(
    "cfg, cycle",
    [
        ({"a": {"exclude": ["b"]}, "b": {"exclude": ["a"]}}, ["a", "b"]),
        (
            {
                "a": {"exclude": ["b"]},
                "b": {"exclude": ["c"]},
                "c": {"exclude": ["a"]},
                "d": {"exclude": ["a"]},
            },
            ["a", "b", "c"],
        ),
    ],
)
def test_check_exclude_names_a_cycle_in_exclude_order(cfg, cycle):
    [(key, msg)] = check_exclude(cfg)
    start = key.removeprefix("pools/").removesuffix("/exclude")
    i = cycle.index(start)  # the cycle is named from whichever of its pools graphlib reaches first
    ring = [*cycle[i:], *cycle[:i], start]
    assert msg == f"pools exclude each other in a cycle: {' excludes '.join(ring)}"
