"""arenaflow.instruct.families: per-constraint-family pass rates, deltas, W/L and exact sign tests
of a
candidate's ifeval readout against a reference's, in the compare JSON a report reads."""

from __future__ import annotations

import json
import random

import pandas as pd
import pytest
from scipy import stats as sps

from arenaflow import manifest
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout_file, readout_rows
from arenaflow.instruct import check as ifcheck
from arenaflow.instruct import families
from arenaflow.instruct import pool as ifpool

# answers whose verdicts differ by constraint: each satisfies some constraints, not others
ANSWERS = [
    "Short answer here.",
    "the history of things, told simply and quietly without capitals",
    "FIRST PARAGRAPH HERE.\n\nSECOND PARAGRAPH HERE.",
    "* one\n* two\n* three",
    '"A quoted answer, with a comma."',
    "Plain text, with 3 digits 123 and a comma.",
]


def readout(pool, answers, arm):
    df = pd.DataFrame(
        {
            "arm": arm,
            "item_id": [r["id"] for r in pool],
            "replicate": 0,
            "category": [r["category"] for r in pool],
            "prompt_sha256": [f"p-{r['id']}" for r in pool],
            "target_sha256": [f"t-{r['id']}" for r in pool],
            "completion": answers,
            "n_tokens": 10,
            "stopped": True,
            "correct": [
                ifcheck.check(a, r["constraints"])["passed"] for r, a in zip(pool, answers)
            ],
            "checks": [families.checks_of(a, r["constraints"]) for r, a in zip(pool, answers)],
        }
    )
    return readout_rows.structure(df)


@pytest.fixture(scope="module")
def sides():
    pool = ifpool.generate(240, 4, "eval", "e", max_constraints=3)
    rng = random.Random(0)
    cand = [rng.choice(ANSWERS) for _ in pool]
    ref = [rng.choice(ANSWERS) for _ in pool]
    return pool, readout(pool, cand, "B"), readout(pool, ref, "A")


def oracle(pool, cand, ref, family):
    """Hand count over the pool: per prompt carrying `family`, does its check pass each side."""
    pairs = []
    for r, a, b in zip(pool, cand, ref):
        mine = [c for c in r["constraints"] if c["type"] == family]
        if mine:
            pairs.append((ifcheck.check(a, mine)["passed"], ifcheck.check(b, mine)["passed"]))
    return pairs


def test_family_table_matches_a_hand_count_and_scipys_binomial_test(sides):
    pool, cand, ref = sides
    res = comparisons.compare(cand, ref, "t")
    table = res["by_family"]
    carried = {c["type"] for r in pool for c in r["constraints"]}
    assert set(table) == carried
    some_discordant = 0
    for family, row in table.items():
        pairs = oracle(pool, cand["completion"], ref["completion"], family)
        wins = sum(a and not b for a, b in pairs)
        losses = sum(b and not a for a, b in pairs)
        assert (row["prompts"], row["wins"], row["losses"]) == (len(pairs), wins, losses)
        assert row["cand_pass"] == pytest.approx(100 * sum(a for a, _ in pairs) / len(pairs))
        assert row["delta"] == pytest.approx(row["cand_pass"] - row["ref_pass"])
        want_p = sps.binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else 1.0
        assert row["p_value"] == pytest.approx(want_p, rel=1e-12)
        some_discordant += wins + losses > 0
    assert some_discordant >= 5  # the fixture exercises the counts, not only zeros
    worst = min(table.values(), key=lambda r: r["delta"])
    assert res["family_delta_min"] == worst["delta"] and table[res["family_min"]] is worst


def test_family_counts_are_per_check_not_per_prompt():
    # both sides fail the prompt (word count), yet the candidate fixes its no-comma constraint
    pool = [
        {
            "id": "x",
            "category": "word_eq",
            "constraints": [{"type": "word_eq", "n": 50}, {"type": "no_char", "chars": ","}],
        }
    ]
    res = comparisons.compare(readout(pool, ["no commas"], "B"), readout(pool, ["a, b"], "A"), "t")
    assert (res["wins"], res["losses"]) == (0, 0)
    assert res["by_family"]["no_char"]["wins"] == 1
    assert res["by_family"]["word_eq"]["wins"] == res["by_family"]["word_eq"]["losses"] == 0
    assert res["by_family"]["no_char"]["delta"] == 100.0 and res["family_min"] == "word_eq"


def test_a_card_sized_family_reproduces_a_published_sign_test():
    # lineage 002, v749 on probe2: placeholders 19 fixed against 32 lost
    row = families.table(
        pd.DataFrame(
            {
                "item_id": range(60),
                "replicate": 0,
                "checks": [
                    json.dumps([{"type": "placeholders", "passed": i < 19}]) for i in range(60)
                ],
                "checks_ref": [
                    json.dumps([{"type": "placeholders", "passed": 19 <= i < 51}])
                    for i in range(60)
                ],
            }
        ),
        "t",
    )["placeholders"]
    assert (row["wins"], row["losses"]) == (19, 32)
    assert row["p_value"] == pytest.approx(sps.binomtest(19, 51).pvalue)
    assert row["delta"] == pytest.approx(100 * (19 - 32) / 60)


def test_sides_with_different_families_or_unreadable_cells_are_named():
    m = pd.DataFrame(
        {
            "item_id": ["a"],
            "replicate": [0],
            "checks": [json.dumps([{"type": "para", "passed": True}])],
            "checks_ref": [json.dumps([{"type": "sent", "passed": True}])],
        }
    )
    with pytest.raises(ValueError, match=r"t: item 'a', replicate 0: families \['para'\]"):
        families.table(m, "t")
    with pytest.raises(ValueError, match=r"item 'a', replicate 0 \(reference\): unreadable"):
        families.table(m.assign(checks_ref="not json"), "t")


def test_non_ifeval_readouts_get_no_family_table():
    df = pd.DataFrame(
        {
            "item_id": ["a", "b"],
            "replicate": 0,
            "category": "add",
            "prompt_sha256": ["p", "q"],
            "target_sha256": ["t", "u"],
            "correct": [True, False],
            "checks": [None, None],
        }
    )
    res = comparisons.compare(df, df, "t")
    assert "by_family" not in res and "family_delta_min" not in res


def test_the_compare_cli_seals_the_table_and_the_families_cli_prints_it(sides, tmp_path, capsys):
    _, cand, ref = sides
    pc, pr = tmp_path / "B.r0.parquet", tmp_path / "A.r0.parquet"
    readout_file.write_readout(cand, pc, {"arm": "B"})
    readout_file.write_readout(ref, pr, {"arm": "A"})
    out = tmp_path / "compare/ifeval/greedy/B__A.json"
    comparisons.main(["compare", "--cand", str(pc), "--ref", str(pr), "--out", str(out)])
    record = comparisons.verify_pooled(out)  # sealed, sources intact
    assert (
        record["by_family"]
        == comparisons.compare(readout_file.load([pc]), readout_file.load([pr]), "x")["by_family"]
    )
    capsys.readouterr()
    families.main([str(out)])
    text = capsys.readouterr().out
    for family, row in record["by_family"].items():
        assert f"| {family} | {row['prompts']} |" in text
    tampered = json.loads(out.read_text())
    tampered["by_family"][record["family_min"]]["delta"] = 0.0
    out.write_text(json.dumps(tampered))
    with pytest.raises(manifest.ManifestError):
        families.main([str(out)])
