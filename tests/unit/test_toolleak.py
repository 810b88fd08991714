"""Lineage 002's decoded tool-leak audit and answer-usable read: arenaflow.instruct.toolleak,
degeneracy.answer_usable, their readout columns and compare's paired W/L on answer_usable."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from scipy import stats as sps

from arenaflow.evals import compare as comparisons
from arenaflow.evals import degeneracy, readout_file, readout_rows
from arenaflow.instruct import check as ifcheck
from arenaflow.instruct import toolleak
from arenaflow.rounds import bar

CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}

# tool calls as the formats print them (chat templates' documented tool-call syntax)
LEAKS = {
    "hermes/qwen": f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>",
    "llama3.1 python_tag": '<|python_tag|>brave_search.call(query="weather in Paris")',
    "llama3.1 function tag": '<function=get_weather>{"city": "Paris"}</function>',
    "mistral": f"[TOOL_CALLS] [{json.dumps(CALL)}]",
    "bare json call": f"Sure, let me check.\n{json.dumps(CALL)}",
    "llama json call": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "openai string arguments": json.dumps(
        {"type": "function", "function": {"name": "f", "arguments": json.dumps({"x": 1})}}
    ),
    "fenced json call": f"```json\n{json.dumps(CALL, indent=2)}\n```",
    "list of calls": json.dumps([{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]),
    "wrapped call in prose": 'Calling: {"function": {"name": "lookup", "arguments": {"q": 1}}}',
    "harmony recipient": "<|start|>assistant<|channel|>commentary to=functions.get_weather",
    "functions call": "I will run functions.get_weather(city='Paris') now.",
}

# ordinary answers that look a little like calls and must not be flagged
CLEAN = {
    "json answer": json.dumps({"name": "Ada Lovelace", "born": 1815, "tags": ["math"]}),
    "json with a name and a list": '{"name": "tea", "steps": ["boil", "steep"]}',
    "a tool definition": json.dumps(
        {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ),
    "arguments that are not json": '{"name": "debate", "arguments": "two sides of it"}',
    "placeholders": "Dear [name], your order [number] ships on [date].",
    "python in a fence": "```python\nfunctions = []\nfunctions.append(f)\nfunctions.pop()\n```",
    "markdown and braces": "Use {curly braces} and [brackets]; set {a: 1} in YAML.",
    "prose about functions": "Pure functions (like f(x) = x + 1) have no side effects.",
    "inline code": "Call `functions.append(f)` to register one; `to=functions.x` is a string.",
    "broken json": '{"name": "x", "arguments": {"a": 1}',
}


@pytest.mark.parametrize("name", list(LEAKS))
def test_tool_call_text_is_flagged(name):
    assert toolleak.leak(LEAKS[name]) is not None, name


@pytest.mark.parametrize("name", list(CLEAN))
def test_ordinary_answers_are_not_flagged(name):
    assert toolleak.leak(CLEAN[name]) is None, name


def test_json_calls_are_found_without_any_marker_and_markers_are_named():
    assert toolleak.leak(json.dumps(CALL)) == "json call"
    assert toolleak.leak(LEAKS["hermes/qwen"]) == "<tool_call>"
    assert toolleak.leak(LEAKS["functions call"]) == "functions."
    # a json_keys answer that passes ifcheck is not a call
    answer = '{"name": "x", "origin": "y"}'
    assert ifcheck.check(answer, [{"type": "json_keys", "keys": ["name", "origin"]}])["passed"]
    assert toolleak.leak(answer) is None


@pytest.mark.parametrize(
    "text,stopped,usable",
    [
        ("A full answer.", True, True),
        ('He said "stop."', True, True),
        ("Is it (really)?", True, True),
        ("**Done!**", True, True),
        ("Here is code:\n```python\nprint(1)\n```", True, True),
        ("An answer without a full stop", True, False),  # the card's discordant kind
        ("A full answer.", False, False),  # not stopped
        ("   ", True, False),  # empty
        ("Broken fence ```", True, False),
        (" ".join(["the same words again and again."] * 8), True, False),  # a loop
    ],
)
def test_answer_usable_is_stopped_nonempty_terminated_and_not_looping(text, stopped, usable):
    assert degeneracy.answer_usable(text, stopped) is usable
    if usable:
        assert stopped and text.strip() and not degeneracy.is_loop(text)


def open_readout(completions, stopped, arm):
    n = len(completions)
    df = pd.DataFrame(
        {
            "arm": arm,
            "item_id": [f"o{i}" for i in range(n)],
            "replicate": 0,
            "category": "open",
            "prompt_sha256": [f"p{i}" for i in range(n)],
            "target_sha256": "t",
            "completion": completions,
            "n_tokens": [len(c.split()) for c in completions],
            "stopped": stopped,
            "correct": stopped,
        }
    )
    return readout_rows.structure(df)


def test_compare_pairs_answer_usable_with_an_exact_sign_test_and_levels_a_bar_can_name():
    good, bad = "A full answer.", "An answer without a full stop"
    # 9 fixed, 3 lost, 6 tied usable, 2 tied unusable; two candidate answers leak a call
    cand = [good] * 9 + [bad] * 3 + [good] * 6 + [bad] * 2
    ref = [bad] * 9 + [good] * 3 + [good] * 6 + [bad] * 2
    cand[0] = cand[1] = LEAKS["hermes/qwen"] + " Done."
    cand_df = open_readout(cand, [True] * 20, "B")
    res = comparisons.compare(cand_df, open_readout(ref, [True] * 20, "A"), "t")
    usable = res["answer_usable"]
    assert (usable["wins"], usable["losses"]) == (9, 3)
    assert usable["p_value"] == pytest.approx(sps.binomtest(9, 12).pvalue, rel=1e-12)
    assert usable["delta"] == pytest.approx(100 * (9 - 3) / 20)
    lv = res["levels"]
    assert lv["cand"]["tool_leak_rate"] == 10.0 and lv["ref"]["tool_leak_rate"] == 0.0
    assert lv["cand"]["answer_usable_rate"] == 75.0 and lv["ref"]["answer_usable_rate"] == 45.0
    assert cand_df["tool_leak"].dtype == bool and cand_df["answer_usable"].dtype == bool
    # the bar can name both levels; vs the incumbent the leak rate is 10 points worse
    clause = {
        "clause": 1,
        "metric": "tool_leak_rate",
        "op": "<=",
        "value": 0.0,
        "suite": "open",
        "regime": "greedy",
        "vs": "incumbent",
        "against": "A",
    }
    judged = bar.judge_clause(clause, "B", "A", {("open", "greedy", "B", "A"): res}, {})
    assert judged["observed"] == 10.0 and not judged["holds"]


def test_a_readout_written_before_the_new_columns_gets_them_on_load(tmp_path):
    df = open_readout(["A full answer.", "no stop"], [True, True], "A")
    old = df.drop(columns=["tool_leak", "answer_usable"])
    readout_file.write_readout(old, tmp_path / "a.parquet", {})
    loaded = readout_file.load([str(tmp_path / "a.parquet")])
    assert loaded["answer_usable"].tolist() == [True, False]
    assert loaded["tool_leak"].tolist() == [False, False]
