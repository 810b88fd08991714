"""Bar clauses that read one turn of a multi-turn suite (`turn: k`).

Lineage 002 on SmolLM2 (BENCHMARKS.md): "every turn passes" was 0/40 for every arm, so a bar on
that suite's headline can never clear, while turn 1 moved (+47.5 points for the DPO anchor).
Here, through the real register -> compare -> judge path: conversations no arm ever completes,
a candidate that fixes turn 1; the headline clause fails, the turn-1 clauses hold with the
numbers scipy gives for the same wins and losses, and the config names a misused turn."""

from __future__ import annotations

import copy
import json

import pytest
from scipy import stats as sps
from test_config_seed002 import TOY, resolved
from test_multiturn import turn_rows

from arenaflow import config as afconfig
from arenaflow import io
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout_file
from arenaflow.rounds import nominate

N = 40  # conversations of 4 turns; nobody passes turn 4
CAND = {f"c{i}": [i < 30, i < 10, i < 3, False] for i in range(N)}
REF = {f"c{i}": [20 <= i < 30, i < 5, False, False] for i in range(N)}
ROUND = {"suite": "mt", "regime": "greedy", "incumbent": "A", "candidates": ["B"]}


def judge(tmp_path, bar_: list[dict]) -> dict:
    rnd = {**ROUND, "bar": bar_}
    reg = str(tmp_path / "nominations/r.bar.json")
    nominate.main(["register", "--round", "r", "--round-json", json.dumps(rnd), "--out", reg])
    sides = []
    for arm, passes in (("B", CAND), ("A", REF)):
        sides.append(str(tmp_path / f"{arm}.parquet"))
        readout_file.write_readout(turn_rows(arm, passes), sides[-1], {"arm": arm, "replicate": 0})
    comp = str(tmp_path / "compare/mt/greedy/B__A.json")
    comparisons.main(["compare", "--suite", "mt", "--regime", "greedy", "--cand", sides[0]]
               + ["--ref", sides[1], "--out", comp])  # fmt: skip
    out = tmp_path / "nominations/r.json"
    nominate.main(
        ["judge", "--round", "r", "--round-json", json.dumps(rnd), "--registration", reg]
        + ["--compare", comp, "--noise", "--readouts", sides[0], "--out", str(out)]
    )
    return io.read_json(out)


def test_a_turn_clause_reads_that_turn_where_the_conversation_headline_cannot_move(tmp_path):
    wins = sum(c[0] and not r[0] for c, r in zip(CAND.values(), REF.values()))
    losses = sum(r[0] and not c[0] for c, r in zip(CAND.values(), REF.values()))
    assert (wins, losses) == (20, 0)
    headline = judge(tmp_path / "a", [{"metric": "delta", "op": ">", "value": 0}])
    (v,) = headline["candidates"]
    assert not v["clears"] and headline["promoted"] == "A"  # the incumbent stays
    assert v["clauses"][0]["observed"] == 0.0  # 0/40 vs 0/40
    turn1 = [
        {"turn": 1, "metric": "delta", "op": ">", "value": 0},
        {"turn": 1, "metric": "p_value", "op": "<", "value": 0.05},
        {"turn": 4, "metric": "wins_minus_losses", "op": ">=", "value": 0},
    ]
    out = judge(tmp_path / "b", turn1)
    (v,) = out["candidates"]
    assert out["promoted"] == "B" and v["clears"]
    delta, p, wml = (c["observed"] for c in v["clauses"])
    assert delta == pytest.approx(100 * (30 - 10) / N)
    assert p == pytest.approx(sps.binomtest(wins, wins + losses).pvalue, rel=1e-12)
    assert wml == 0
    assert [c["turn"] for c in out["bar"]] == [1, 1, 4]  # in the registered meaning (its sha256)


def test_a_turn_the_comparison_lacks_is_undefined_and_fails(tmp_path):
    out = judge(tmp_path, [{"turn": 5, "metric": "delta", "op": ">=", "value": 0}])
    (c,) = out["candidates"][0]["clauses"]
    assert out["promoted"] == "A" and c["observed"] is None
    assert "turn 5's delta is not in the comparison B vs A on mt/greedy" in c["undefined"]


def test_the_config_names_a_turn_clause_on_a_single_turn_suite_a_turn_past_the_last_and_a_level(
    tmp_path,
):
    raw, sources = afconfig.load_configs(TOY)
    rid = next(r for r, v in raw["rounds"].items() if v["suite"] != "multiturn")
    cases = [
        ({"turn": 1, "metric": "delta", "op": ">", "value": 0}, "bar/0/turn", "not multi-turn"),
        (
            {"suite": "multiturn", "regime": "greedy", "turn": 5, "metric": "delta", "op": ">",
             "value": 0},
            "bar/0/turn",
            "turn 5: suite 'multiturn' has 4 turns",
        ),
        (
            {"suite": "multiturn", "regime": "greedy", "turn": 2, "metric": "accuracy", "op": ">",
             "value": 0},
            "bar/0/metric",
            "'accuracy' is not kept per turn",
        ),
    ]  # fmt: skip
    for clause, key, message in cases:
        bad = copy.deepcopy(raw)
        bad["rounds"][rid]["bar"] = [clause]
        with pytest.raises(afconfig.ConfigError) as e:
            afconfig.resolve(bad, config_file="002.yaml", sources=sources)
        assert f"rounds/{rid}/{key}'" in str(e.value) and message in str(e.value)
    ok = copy.deepcopy(raw)
    ok["rounds"][rid]["bar"].append(
        {"suite": "multiturn", "regime": "greedy", "turn": 1, "metric": "delta", "op": ">",
         "value": 0}
    )  # fmt: skip
    assert afconfig.resolve(ok, config_file="002.yaml", sources=sources)
    assert resolved(TOY)  # the shipped config is untouched
