"""Failure analysis by checker reason: per-family tallies, paired fixed/lost, refusal of a
readout whose reasons another checker wrote, and the CLI's sealed file."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from scipy.stats import binomtest

from arenaflow import candidates, io, manifest
from arenaflow.evals import failures, readout_file, readout_rows

POOL = [
    {
        "id": "a",
        "category": "word_eq",
        "prompt": "p a",
        "constraints": [{"type": "word_eq", "n": 3}, {"type": "sent", "n": 1}],
    },
    {
        "id": "b",
        "category": "word_eq",
        "prompt": "p b",
        "constraints": [{"type": "word_eq", "n": 5}],
    },
    {
        "id": "c",
        "category": "word_times",
        "prompt": "p c",
        "constraints": [{"type": "word_times", "word": "cat", "n": 2}, {"type": "sent", "n": 2}],
    },
    {"id": "d", "category": "sent", "prompt": "p d", "constraints": [{"type": "sent", "n": 1}]},
]
# completions of the arm and its parent (hand-checked below)
CAND = {
    "a": "One two three.",  # word_eq ok, sent ok
    "b": "One two three four.",  # word_eq 4 != 5 (off by 1)
    "c": "A cat. A cat and a cat.",  # word_times 3 != 2 (off 1), sent ok
    "d": "Yes. No.",  # sent 2 != 1
}
REF = {
    "a": "One two three four five six.",  # word_eq 6 != 3 (off 3), sent ok
    "b": "One two three four five.",  # ok
    "c": "A cat. The cat.",  # ok
    "d": "Yes. No.",  # sent fails
}


def readout(texts: dict, arm: str, cut: frozenset = frozenset()) -> pd.DataFrame:
    """A readout as readout_rows.readout writes it, its reasons and `correct` from
    candidates.verdict; the items in `cut` ran out of tokens (stopped False: truncated)."""
    recs = []
    for r in POOL:
        stopped = r["id"] not in cut
        v = candidates.verdict(
            {
                "id": r["id"],
                "prompt_id": r["id"],
                "sample": 0,
                "text": texts[r["id"]],
                "n_tokens": 5,
                "stopped": stopped,
            },
            r,
        )
        recs.append(
            {
                "arm": arm,
                "item_id": r["id"],
                "category": r["category"],
                "prompt_sha256": "p" + r["id"],
                "target_sha256": readout_rows.target_of(r),
                "completion": texts[r["id"]],
                "n_tokens": 5,
                "stopped": stopped,
                "pred": None,
                "strict": v["correct"],
                "reasons": "; ".join(v["reasons"]),
                "correct": v["correct"],
                "replicate": 0,
            }
        )
    return readout_rows.structure(pd.DataFrame(recs))


def rows(record):
    return {r["family"]: r for r in record["table"]}


def test_tallies_by_family_as_counted_by_hand():
    rec = failures.table(POOL, readout(CAND, "A"), None, "t")
    t = rows(rec)
    assert (t["word_eq"]["carrying"], t["word_eq"]["failing"]) == (2, 1)
    assert (t["sent"]["carrying"], t["sent"]["failing"]) == (3, 1)
    assert (t["word_times"]["carrying"], t["word_times"]["failing"]) == (1, 1)
    assert t["sent"]["miss_rate"] == pytest.approx(1 / 3)
    assert t["word_eq"]["near_miss"] == {"off_le_1": 1, "off_le_2": 1, "off_le_3": 1}
    assert rec["all"] == {"prompts": 4, "failing": 3}
    # most failing first, then by name
    assert [r["family"] for r in rec["table"]] == ["sent", "word_eq", "word_times"]


def test_paired_against_the_parent_counts_fixed_and_lost_per_family():
    rec = failures.table(POOL, readout(CAND, "A"), readout(REF, "P"), "t")
    t = rows(rec)
    # word_eq: a fixed (parent 6 words), b lost (arm 4 words)
    assert (t["word_eq"]["fixed"], t["word_eq"]["lost"], t["word_eq"]["ref_failing"]) == (1, 1, 1)
    assert (t["word_times"]["fixed"], t["word_times"]["lost"]) == (0, 1)
    assert (t["sent"]["fixed"], t["sent"]["lost"]) == (0, 0)
    assert t["word_times"]["p_value"] == pytest.approx(binomtest(0, 1, 0.5).pvalue)
    # prompts: a fixed; b, c lost; d fails on both
    assert (rec["all"]["fixed"], rec["all"]["lost"]) == (1, 2)


def test_incorrect_rows_are_partitioned_by_reason_truncated_ones_included():
    texts = {
        "a": "One two three.",  # passes every check, but cut off: incorrect, no check failed
        "b": "One two three four.",  # cut off and fails word_eq: put down to the truncation
        "c": "A cat. A cat and a cat.",  # stopped, fails word_times only
        "d": "",  # stopped, empty: fails sent too, put down to being empty
    }
    df = readout(texts, "A", cut=frozenset({"a", "b"}))
    rec = failures.table(POOL, df, None, "t")
    assert rec["all"] == {"prompts": 4, "failing": 3}  # checks: b, c, d (a passes them all)
    inc = rec["incorrect"]
    assert inc["by_reason"] == {"truncated": 2, "empty": 1, "word_times": 1}
    # exactly the readout's incorrect rows: every one under one reason, no correct row counted
    assert inc["incorrect"] == sum(inc["by_reason"].values()) == int((~df["correct"]).sum())
    assert inc["rows"] == len(df)


def test_a_row_failing_two_families_is_counted_once_and_correct_rows_not_at_all():
    texts = {**CAND, "a": "One two. Three four five six."}  # word_eq 6 != 3 and sent 2 != 1
    df = readout(texts, "A")
    inc = failures.table(POOL, df, readout(REF, "P"), "t")
    assert inc["incorrect"]["by_reason"] == {
        "sent": 1,
        "sent+word_eq": 1,
        "word_eq": 1,
        "word_times": 1,
    }
    assert inc["incorrect"]["incorrect"] == int((~df["correct"]).sum()) == 4
    # the parent: a fails word_eq, d fails sent; b and c are correct and not counted
    assert inc["ref_incorrect"]["by_reason"] == {"sent": 1, "word_eq": 1}


def test_a_readout_whose_correct_disagrees_with_its_flags_is_refused_naming_the_item():
    df = readout(CAND, "A", cut=frozenset({"a"}))
    df.loc[df["item_id"] == "a", "correct"] = True  # a truncated answer scored correct
    with pytest.raises(
        ValueError, match=r"x.parquet: candidate: item 'a', replicate 0: .*truncated"
    ):
        failures.table(POOL, df, None, "x.parquet")


def test_a_readout_whose_reasons_another_checker_wrote_is_refused_naming_the_item():
    df = readout(CAND, "A")
    df.loc[df["item_id"] == "b", "reasons"] = "word_eq: 9 words, expected 5"
    with pytest.raises(ValueError, match=r"readouts/x.parquet: candidate: item 'b'"):
        failures.table(POOL, df, None, "readouts/x.parquet")


def test_a_math_item_is_refused():
    pool = [*POOL[:3], {"id": "d", "category": "add", "prompt": "1+1", "gold": "2"}]
    with pytest.raises(ValueError, match="item 'd' is not an instruction-following row"):
        failures.table(pool, readout(CAND, "A"), None, "t")


def test_cli_writes_a_sealed_table_that_reloads(tmp_path):
    io.write_jsonl(tmp_path / "pool.jsonl", POOL)
    paths = {}
    for arm, texts in (("A", CAND), ("P", REF)):
        paths[arm] = str(tmp_path / f"{arm}.parquet")
        readout_file.write_readout(readout(texts, arm), paths[arm], {"arm": arm})
    out = tmp_path / "failures" / "A__P.json"
    failures.main(
        [
            "--pool",
            str(tmp_path / "pool.jsonl"),
            "--cand",
            paths["A"],
            "--ref",
            paths["P"],
            "--out",
            str(out),
        ]
    )
    rec = manifest.check_seal(json.loads(out.read_text()), out)
    assert (rec["cand"], rec["ref"]) == ("A", "P")
    assert rows(rec)["word_eq"]["fixed"] == 1
    assert rec["readouts"]["cand"][0]["sha256"] == manifest.sha256_file(paths["A"])
    assert failures.tsv(rec).splitlines()[0].split("\t")[:4] == [
        "family",
        "carrying",
        "failing",
        "miss_rate",
    ]
