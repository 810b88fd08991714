"""arenaflow.nominate: the bar applied to each candidate, the promotion and its record."""

from __future__ import annotations

import json
import re

import pytest

from arenaflow import io, nominate

BAR = [
    {"metric": "delta", "op": ">", "value": 0.0},
    {"metric": "wins_minus_losses", "op": ">=", "value": 3},
]


def comparison(delta: float, wins: int, losses: int, p: float = 0.5, acc: float = 50.0) -> dict:
    return {"delta": delta, "wins": wins, "losses": losses, "wins_minus_losses": wins - losses,
            "p_value": p, "accuracy": acc, "ci95": [delta - 5, delta + 5]}


def round_(candidates, bar=BAR, incumbent="R2d") -> dict:
    return {"suite": "math", "regime": "greedy", "incumbent": incumbent,
            "candidates": list(candidates), "bar": bar}


def test_of_two_that_clear_the_larger_delta_is_promoted():
    comps = {
        "B1": comparison(2.0, 10, 4),   # clears
        "B2": comparison(-1.0, 3, 6),   # fails delta
        "B3": comparison(3.5, 15, 4),   # clears, larger delta
        "B4": comparison(5.0, 5, 3),    # larger delta but W-L = 2 < 3
    }
    out = nominate.nominate("r3", round_(comps), comps)
    assert out["promoted"] == "B3"
    assert [v["clears"] for v in out["candidates"]] == [True, False, True, False]
    assert "B3" in out["reason"] and "2 that clear" in out["reason"]
    assert "+3.50" in out["reason"]


def test_equal_deltas_promote_the_first_listed():
    comps = {"B2": comparison(2.0, 9, 3), "B1": comparison(2.0, 8, 2)}
    assert nominate.nominate("r", round_(["B2", "B1"]), comps)["promoted"] == "B2"
    assert nominate.nominate("r", round_(["B1", "B2"]), comps)["promoted"] == "B1"


def test_when_nothing_clears_the_incumbent_stays_with_a_reason():
    comps = {"B1": comparison(-0.5, 4, 5), "B2": comparison(1.0, 6, 4)}
    out = nominate.nominate("r3", round_(comps), comps)
    assert out["promoted"] == "R2d"
    assert not any(v["clears"] for v in out["candidates"])
    assert "no candidate clears" in out["reason"] and "R2d" in out["reason"]


def test_each_clause_records_observed_value_and_verdict():
    comps = {"B1": comparison(1.0, 6, 4)}  # delta holds, W-L = 2 fails
    out = nominate.nominate("r3", round_(comps), comps)
    (v,) = out["candidates"]
    assert v["arm"] == "B1"
    assert v["clauses"] == [
        {"metric": "delta", "op": ">", "value": 0.0, "observed": 1.0, "holds": True},
        {"metric": "wins_minus_losses", "op": ">=", "value": 3, "observed": 2, "holds": False},
    ]
    assert (v["delta"], v["wins"], v["losses"]) == (1.0, 6, 4)
    assert v["ci95"] == [-4.0, 6.0]


@pytest.mark.parametrize(
    "op, observed, value, holds",
    [(">", 0.0, 0.0, False), (">=", 0.0, 0.0, True), ("<", 0.05, 0.05, False),
     ("<=", 0.05, 0.05, True), ("<", 0.04, 0.05, True), (">", -1.0, 0.0, False)],
)
def test_clause_operators_at_the_boundary(op, observed, value, holds):
    bar = [{"metric": "p_value", "op": op, "value": value}]
    v = nominate.judge("B1", comparison(1.0, 5, 1, p=observed), bar)
    assert v["clauses"][0]["holds"] is holds
    assert v["clears"] is holds


def test_output_records_round_bar_and_its_sha256():
    comps = {"B1": comparison(2.0, 10, 4)}
    out = nominate.nominate("r3", round_(comps), comps)
    assert (out["round"], out["suite"], out["regime"], out["incumbent"]) == ("r3", "math", "greedy", "R2d")
    assert out["bar"] == BAR
    assert out["bar_sha256"] == nominate.bar_sha256(BAR)
    assert re.fullmatch(r"[0-9a-f]{64}", out["bar_sha256"])


def test_bar_sha256_changes_when_the_bar_changes():
    looser = [dict(BAR[0]), dict(BAR[1], value=2)]
    flipped = [dict(BAR[0], op=">="), dict(BAR[1])]
    shorter = [dict(BAR[0])]
    hashes = {nominate.bar_sha256(b) for b in (BAR, looser, flipped, shorter)}
    assert len(hashes) == 4


def test_bar_sha256_ignores_key_order_within_a_clause():
    reordered = [{"value": c["value"], "op": c["op"], "metric": c["metric"]} for c in BAR]
    assert nominate.bar_sha256(reordered) == nominate.bar_sha256(BAR)


def test_missing_comparison_is_an_error_naming_the_candidate():
    with pytest.raises(ValueError, match="B2"):
        nominate.nominate("r3", round_(["B1", "B2"]), {"B1": comparison(1.0, 5, 1)})


def test_cli_writes_nomination_and_refuses_a_comparison_against_another_arm(tmp_path):
    rnd = round_(["B1", "B3"])
    paths = []
    for arm, c in {"B1": comparison(1.0, 6, 2), "B3": comparison(2.0, 9, 3)}.items():
        p = tmp_path / f"{arm}__R2d.json"
        io.write_json(p, {**c, "cand": arm, "ref": "R2d"})
        paths.append(str(p))
    out = tmp_path / "nominations" / "r3.json"
    nominate.main(["--round", "r3", "--round-json", json.dumps(rnd), "--compare", *paths,
                   "--out", str(out)])
    assert io.read_json(out)["promoted"] == "B3"

    wrong = tmp_path / "B1__S1.json"
    io.write_json(wrong, {**comparison(1.0, 6, 2), "cand": "B1", "ref": "S1"})
    with pytest.raises(ValueError, match="not the incumbent"):
        nominate.main(["--round", "r3", "--round-json", json.dumps(rnd), "--compare", str(wrong),
                       paths[1], "--out", str(tmp_path / "x.json")])
