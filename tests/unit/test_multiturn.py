"""Multi-turn instruction-following readouts: ifpool.conversations (constraints introduced
across turns), the turn-by-turn readout with the model's own replies in context
(arenaflow.instruct.multiturn, on the embedded tiny model), and compare's per-conversation
outcome."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from scipy import stats as sps

from arenaflow import chat, io, manifest
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout_file, readout_rows
from arenaflow.instruct import check as ifcheck
from arenaflow.instruct import constraints as ifconstraints
from arenaflow.instruct import domains as ifdomains
from arenaflow.instruct import pool as ifpool
from arenaflow.pools import build as pools
from arenaflow.pools.validate import validate_rows


@pytest.fixture(scope="module")
def convs():
    params = {"kind": "ifeval", "n": 200, "seed": 5, "split": "eval", "turns": 4}
    return pools.build("mt", params)


def test_each_turn_adds_one_compatible_constraint_in_its_own_message(convs):
    _, values = ifpool.split_values("eval")
    for r in convs:
        assert len(r["turns"]) == len(r["constraints"]) == 4 and r["prompt"] == r["turns"][0]
        types = [c["type"] for c in r["constraints"]]
        assert len(set(types)) == 4 and not set(types) & ifdomains.SOLO
        assert all(frozenset((a, b)) not in ifdomains.CONFLICTS for a in types for b in types)
        assert r["category"] == types[0]
        for k, (message, c) in enumerate(zip(r["turns"], r["constraints"])):
            assert ifconstraints.describe(c) in message  # turn k introduces constraint k ...
            for later in r["constraints"][k + 1 :]:  # ... and no later one
                assert ifconstraints.describe(later) not in message
            for p, v in c.items():  # values from the eval side only
                if p != "type" and (c["type"], p) in values:
                    assert set(v if isinstance(v, list) else [v]) <= set(values[(c["type"], p)])
        assert all(ifdomains.KEEP.split("{c}")[0] in m for m in r["turns"][1:])
    assert len({json.dumps(r["turns"]) for r in convs}) == len(convs)


def test_conversations_are_seeded_prefix_stable_and_checked():
    a = ifpool.conversations(30, 2, "probe", "p", 4)
    assert a == ifpool.conversations(30, 2, "probe", "p", 4)
    assert ifpool.conversations(40, 2, "probe", "p", 4)[:30] == a  # what exclusion relies on
    assert a != ifpool.conversations(30, 3, "probe", "p", 4)
    with pytest.raises(ValueError, match="turns must be 2..7"):
        ifpool.conversations(3, 0, "eval", "p", 9)
    rows = [{"id": "a", "prompt": "x", "category": "c", "constraints": [{"type": "quoted"}]}]
    with pytest.raises(ValueError, match=r"pools/m\.jsonl:1: 2 turns but 1 constraints"):
        validate_rows([{**rows[0], "turns": ["x", "y"]}], "pools/m.jsonl", "ifeval")


@pytest.fixture(scope="module")
def tiny(repo_root):
    from arenaflow import models

    return models.load_policy(repo_root / "models/tiny-arith", None)


POOL = [
    {
        "id": "c1",
        "category": "no_char",
        "prompt": "Ann has 3 pens and gets 4 more. How many pens now?",
        "turns": [
            "Ann has 3 pens and gets 4 more. How many pens now?",
            "Ben has 5 cups and gets 2 more. How many cups now?",
            "Cal has 9 hats and gives away 4. How many hats now?",
        ],
        "constraints": [
            {"type": "no_char", "chars": ","},
            {"type": "no_digits"},
            {"type": "word_max", "n": 200},
        ],
    },
    {
        "id": "c2",
        "category": "word_max",
        "prompt": "Dee has 8 cards and gets 3 more. How many cards now?",
        "turns": [
            "Dee has 8 cards and gets 3 more. How many cards now?",
            "Eve has 6 pens and gets 6 more. How many pens now?",
        ],
        "constraints": [{"type": "word_max", "n": 200}, {"type": "no_char", "chars": "!"}],
    },
]


def test_the_readout_decodes_turn_by_turn_with_its_own_replies_in_context(tiny):
    model, tok = tiny
    regime = {"temperature": 0.0, "max_new_tokens": 32}
    df = readout_rows.readout(POOL, model, tok, "Be brief.", regime, 0, 8, "mt").set_index(
        "item_id"
    )
    assert list(df.index) == ["c1/t1", "c2/t1", "c1/t2", "c2/t2", "c1/t3"]  # turn-major
    for r in POOL:
        msgs = chat.prompt_messages("Be brief.", r["turns"][0])
        for k in range(len(r["turns"])):
            row = df.loc[f"{r['id']}/t{k + 1}"]
            assert (row["conversation"], row["turn"], row["category"]) == (
                r["id"],
                k + 1,
                r["category"],
            )
            # the prompt decoded at turn k holds the model's own replies to turns 1..k-1
            assert row["context_sha256"] == manifest.sha256_text(chat.render(msgs, True))
            want = ifcheck.check(row["completion"], r["constraints"][: k + 1])
            assert json.loads(row["checks"]) == [
                {"type": c["type"], "passed": c["passed"]} for c in want["checks"]
            ]
            clean = row["stopped"] and not (row["empty"] or row["fffd"] or row["loop"])
            assert row["correct"] == (want["passed"] and clean)
            msgs = msgs + [{"role": "assistant", "content": row["completion"]}]
            if k + 1 < len(r["turns"]):
                msgs.append({"role": "user", "content": r["turns"][k + 1]})
    # the tiny arithmetic model answers with digits: turn 2 of c1 forbids them
    assert not json.loads(df.loc["c1/t2", "checks"])[1]["passed"]
    # the same seed reads out the same rows
    again = readout_rows.readout(POOL, model, tok, "Be brief.", regime, 0, 8, "mt").set_index(
        "item_id"
    )
    pd.testing.assert_frame_equal(df, again)


def turn_rows(arm, passes):
    """Hand-made readout rows: passes = {conversation: [turn verdicts]}."""
    recs = [
        {
            "arm": arm,
            "item_id": f"{c}/t{k + 1}",
            "conversation": c,
            "turn": k + 1,
            "replicate": 0,
            "category": "para",
            "prompt_sha256": f"p-{c}-{k}",
            "target_sha256": f"t-{c}-{k}",
            "completion": "An answer.",
            "n_tokens": 3,
            "stopped": True,
            "correct": ok,
            "checks": json.dumps([{"type": "para", "passed": ok}]),
        }
        for c, verdicts in passes.items()
        for k, ok in enumerate(verdicts)
    ]
    return readout_rows.structure(pd.DataFrame.from_records(recs))


def test_compare_scores_a_conversation_by_all_its_turns_and_reports_each_turn(tmp_path):
    cand = {f"c{i}": [True, True, True, i % 3 != 0] for i in range(12)}  # 8 of 12 pass all
    ref = {f"c{i}": [True, i % 2 == 0, True, True] for i in range(12)}  # 6 of 12 pass all
    res = comparisons.compare(turn_rows("B", cand), turn_rows("A", ref), "t")
    every = {c: all(v) for c, v in cand.items()}, {c: all(v) for c, v in ref.items()}
    wins = sum(every[0][c] and not every[1][c] for c in cand)
    losses = sum(every[1][c] and not every[0][c] for c in cand)
    assert res["n"] == 12 and (res["wins"], res["losses"]) == (wins, losses) == (4, 2)
    assert res["accuracy"] == pytest.approx(100 * 8 / 12)
    assert res["p_value"] == pytest.approx(sps.binomtest(4, 6).pvalue, rel=1e-12)
    t2, t4 = res["by_turn"][2], res["by_turn"][4]
    assert (t2["wins"], t2["losses"], t4["wins"], t4["losses"]) == (6, 0, 0, 4)
    assert res["by_family"]["para"]["prompts"] == 48  # check level: every turn
    # the compare CLI seals it, with by_turn keys as JSON turns
    paths = [tmp_path / "B.parquet", tmp_path / "A.parquet"]
    readout_file.write_readout(turn_rows("B", cand), paths[0], {})
    readout_file.write_readout(turn_rows("A", ref), paths[1], {})
    out = tmp_path / "c.json"
    comparisons.main(
        ["compare", "--cand", str(paths[0]), "--ref", str(paths[1]), "--out", str(out)]
    )
    record = comparisons.verify_pooled(out)
    assert record["by_turn"]["4"]["losses"] == 4 and record["wins"] == 4
    assert io.read_json(out)["n"] == 12


def test_the_schema_takes_turns_for_ifeval_pools(repo_root):
    import copy

    import yaml

    from arenaflow import config

    raw = yaml.safe_load((repo_root / "config/config.yaml").read_text())
    cfg = copy.deepcopy(raw)
    cfg["pools"]["if_turns"] = {"kind": "ifeval", "n": 40, "seed": 0, "split": "eval", "turns": 4}
    resolved = config.resolve(cfg, repo_root=repo_root, config_file="config/config.yaml")
    assert resolved["pools"]["if_turns"]["turns"] == 4


def test_a_corpus_on_a_multi_turn_pool_is_refused_naming_the_key(repo_root):
    import copy

    import yaml

    from arenaflow import config

    cfg = yaml.safe_load((repo_root / "config/config.yaml").read_text())
    cfg = copy.deepcopy(cfg)
    cfg["pools"]["if_turns"] = {"kind": "ifeval", "n": 40, "seed": 0, "split": "train", "turns": 4}
    corpus = next(iter(cfg["corpora"]))
    cfg["corpora"][corpus]["pool"] = "if_turns"
    with pytest.raises(config.ConfigError, match=rf"key 'corpora/{corpus}/pool'.*multi-turn"):
        config.resolve(cfg, repo_root=repo_root, config_file="config/config.yaml")
