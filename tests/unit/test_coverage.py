"""arenaflow.corpora.coverage: the coverage ILP against optima worked out by hand."""

from __future__ import annotations

import itertools
import json

import pytest

from arenaflow.corpora import coverage
from arenaflow.corpora.coverage import CoverageError


def row(i, group, tokens, prompt=None):
    return {"id": i, "group": group, "tokens": tokens, "prompt_id": prompt or i}


# Two candidate answers for prompts p1 and p3; groups alg (3 prompts), cnt (2), num (1).
ROWS = [
    row("p1a", "alg", 100, "p1"),
    row("p1b", "alg", 40, "p1"),
    row("p2", "alg", 60),
    row("p3a", "cnt", 90, "p3"),
    row("p3b", "cnt", 200, "p3"),
    row("p4", "cnt", 50),
    row("p5", "num", 300),
    row("p6", "alg", 10),
]


def brute_force(rows, objective, feasible):
    """The optimum by enumeration (for the small cases here)."""
    best = None
    for k in range(len(rows) + 1):
        for combo in itertools.combinations(rows, k):
            if feasible(combo):
                v = objective(combo)
                best = v if best is None or v > best else best
    return best


def test_row_budget_with_group_minimums_known_optimum():
    # weights alg 1, cnt 2, num 5; 3 rows; at least 1 alg. Best: num (5) + one cnt (2) ... but
    # cnt has two prompts (p3, p4): num + p3 + p4 = 9 breaks "at least 1 alg" -> num + cnt + alg = 8
    sel = coverage.select(
        ROWS, row_budget=3, min_per_group={"alg": 1}, weights={"alg": 1, "cnt": 2, "num": 5}
    )
    assert sel.status == "Optimal"
    assert sel.objective == pytest.approx(8.0)
    assert sel.per_group == {"alg": 1, "cnt": 1, "num": 1}
    assert len(sel.ids) == 3 and "p5" in sel.ids


def test_token_budget_known_optimum_unique():
    # unit weights, 200 tokens, one row per prompt. Cheapest per prompt: p6 10, p1b 40, p4 50,
    # p2 60, p3a 90, p5 300. Most rows within 200: 10 + 40 + 50 + 60 = 160 (4 rows); a fifth
    # needs 90 more -> 250 > 200. So the optimum is 4 rows: {p6, p1b, p4, p2}, uniquely.
    sel = coverage.select(ROWS, token_budget=200)
    assert sel.objective == pytest.approx(4.0)
    assert sorted(sel.ids) == ["p1b", "p2", "p4", "p6"]
    assert sel.tokens == 160
    assert sel.per_group == {"alg": 3, "cnt": 1, "num": 0}


def test_at_most_one_row_per_prompt():
    sel = coverage.select(ROWS, row_budget=100)
    assert len(sel.ids) == 6  # six prompts
    prompts = [next(r["prompt_id"] for r in ROWS if r["id"] == i) for i in sel.ids]
    assert len(set(prompts)) == len(prompts)


def test_minimums_change_the_token_optimum():
    # at least 1 num (p5, 300 tokens) within 400: 100 left -> p6 10 + p1b 40 + p4 50 = 100 -> 4 rows
    sel = coverage.select(ROWS, token_budget=400, min_per_group={"num": 1})
    assert sel.objective == pytest.approx(4.0)
    assert sorted(sel.ids) == ["p1b", "p4", "p5", "p6"]
    assert sel.tokens == 400


def test_inverse_weights_prefer_rare_groups():
    # inverse: alg 1/3 per row (3 prompts), cnt 1/2, num 1. Two rows: num + a cnt = 1.5
    sel = coverage.select(ROWS, row_budget=2, weights="inverse")
    assert sel.objective == pytest.approx(1.5)
    assert sel.per_group == {"alg": 0, "cnt": 1, "num": 1}


def test_max_per_group_caps_a_group():
    sel = coverage.select(ROWS, row_budget=5, max_per_group={"alg": 1})
    assert sel.per_group["alg"] == 1
    assert sel.objective == pytest.approx(4.0)  # 1 alg + 2 cnt + 1 num


def test_matches_brute_force_on_a_random_case():
    import random

    rng = random.Random(0)
    rows = [
        row(f"r{i}", rng.choice("abc"), rng.randint(5, 60), f"p{rng.randint(0, 7)}")
        for i in range(12)
    ]
    w = {"a": 1.0, "b": 1.7, "c": 0.6}
    mins = {"b": 1}
    sel = coverage.select(rows, token_budget=120, min_per_group=mins, weights=w)

    def feasible(combo):
        prompts = [r["prompt_id"] for r in combo]
        return (
            len(set(prompts)) == len(prompts)
            and sum(r["tokens"] for r in combo) <= 120
            and sum(r["group"] == "b" for r in combo) >= 1
        )

    best = brute_force(rows, lambda c: sum(w[r["group"]] for r in c), feasible)
    assert sel.objective == pytest.approx(best)
    chosen = [r for r in rows if r["id"] in sel.ids]
    assert feasible(chosen)
    assert sum(w[r["group"]] for r in chosen) == pytest.approx(best)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (
            {"row_budget": 3, "min_per_group": {"num": 2}},
            r"group 'num' needs at least 2 rows but only 1 prompts",
        ),
        (
            {"row_budget": 2, "min_per_group": {"alg": 2, "cnt": 1}},
            r"minimums sum to 3 rows, over the row budget 2",
        ),
        (
            {"token_budget": 100, "min_per_group": {"num": 1}},
            r"need at least 300 tokens, over the token budget 100",
        ),
        (
            {"row_budget": 3, "min_per_group": {"geo": 1}},
            r"group 'geo' needs at least 1 rows but only 0 prompts",
        ),
        (
            {"row_budget": 3, "min_per_group": {"alg": 2}, "max_per_group": {"alg": 1}},
            r"minimum 2 exceeds maximum 1",
        ),
        ({"token_budget": 320, "min_per_group": {"cnt": 1, "num": 1}}, r"need at least 350 tokens"),
    ],
)
def test_infeasible_problems_raise_with_the_reason(kwargs, reason):
    with pytest.raises(CoverageError, match=reason):
        coverage.select(ROWS, **kwargs)


def test_infeasibility_only_the_solver_sees_is_reported():
    # one prompt with a candidate in each of two groups: each minimum alone is satisfiable, but
    # at most one row per prompt makes both together impossible
    rows = [row("q1x", "x", 10, "q1"), row("q1y", "y", 10, "q1"), row("q2", "x", 10)]
    with pytest.raises(
        CoverageError, match=r"CBC status Infeasible: no subset keeps at most one row per prompt"
    ):
        coverage.select(rows, row_budget=5, min_per_group={"x": 2, "y": 1, "z": 0})


def test_bad_arguments():
    with pytest.raises(CoverageError, match="row_budget, a token_budget or both"):
        coverage.select(ROWS)
    with pytest.raises(CoverageError, match="duplicate row ids"):
        coverage.select(ROWS + [ROWS[0]], row_budget=2)
    with pytest.raises(CoverageError, match="no entry for group"):
        coverage.select(ROWS, row_budget=2, weights={"alg": 1})
    with pytest.raises(CoverageError, match="no candidate rows"):
        coverage.select([], row_budget=2)


def test_cli_writes_the_selection(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({**r, "category": r["group"]}) + "\n" for r in ROWS))
    out = tmp_path / "chosen.json"
    coverage.main(["--rows", str(rows), "--token-budget", "200", "--out", str(out)])
    got = json.loads(out.read_text())
    assert sorted(got["ids"]) == ["p1b", "p2", "p4", "p6"]
    assert got["objective"] == 4.0 and got["per_group"] == {"alg": 3, "cnt": 1, "num": 0}
