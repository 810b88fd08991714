"""arenaflow.evals.judged: the blinded packet hides the arms and unblinds to the readouts; the score
reproduces lineage 002's judged read and safety probe (docs/lineages.md#002-the-blinded-judged-read,
docs/lineages.md#002-the-safety-probe) with scipy's binomial test as the oracle."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from scipy.stats import binomtest

from arenaflow import io
from arenaflow.evals import judged, readout_file, readout_rows

CATS = {"c1": 30, "c2": 20, "c3": 10}
DISCORDANT = [f"c1-{i}" for i in range(5)]  # arm X answers these with nothing


def readout(arm: str, texts: dict | None = None, cut: frozenset = frozenset()) -> pd.DataFrame:
    """Every item answered with a usable sentence, but arm X's DISCORDANT ones (empty), `texts`
    and `cut` (items that ran out of tokens)."""
    recs = []
    for cat, k in CATS.items():
        for i in range(k):
            item = f"{cat}-{i}"
            text = "" if arm == "armX" and item in DISCORDANT else f"answer of {arm[-1]} to {item}."
            text = (texts or {}).get(item, text)
            recs.append(
                {
                    "arm": arm,
                    "item_id": item,
                    "replicate": 0,
                    "category": cat,
                    "prompt_sha256": f"p{item}",
                    "target_sha256": f"t{item}",
                    "completion": text,
                    "n_tokens": len(text),
                    "stopped": item not in cut,
                    "correct": bool(i % 2),
                }
            )
    return readout_rows.structure(pd.DataFrame(recs))


POOL = [
    {"id": f"{c}-{i}", "prompt": f"question {c}-{i}", "category": c}
    for c, k in CATS.items()
    for i in range(k)
]


def test_the_packet_reads_every_discordant_item_then_concordant_ones_by_category_and_unblinds():
    a, b = readout("armX"), readout("armY")
    pairs, key = judged.pack(POOL, a, b, n=20, seed=20261005, where="t")
    assert len(pairs) == 20 and [p["pair"] for p in pairs] == [f"p{i:02d}" for i in range(1, 21)]
    rows = key["pairs"]
    assert (
        sorted(r["item_id"] for r in rows.values() if r["stratum"] == "structurally discordant")
        == DISCORDANT
    )
    # 15 concordant over c1 25, c2 20, c3 10 by largest remainder: 6.82, 5.45, 2.73 -> 7, 5, 3
    assert key["concordant_by_category"] == {"c1": 7, "c2": 5, "c3": 3}
    assert len({r["item_id"] for r in rows.values()}) == 20
    text = {
        (arm, r["item_id"]): r["completion"]
        for arm, df in (("armX", a), ("armY", b))
        for r in df.to_dict("records")
    }
    prompt = {r["id"]: r["prompt"] for r in POOL}
    for p in pairs:
        k = rows[p["pair"]]
        assert {k["A"], k["B"]} == {"armX", "armY"}
        assert p["A"] == text[(k["A"], k["item_id"])] and p["B"] == text[(k["B"], k["item_id"])]
        assert p["prompt"] == prompt[k["item_id"]]
    assert {rows[p]["A"] for p in rows} == {"armX", "armY"}  # sides are swapped, not fixed
    assert "arm" not in json.dumps(pairs)  # nothing in the packet names an arm


def test_discordant_means_the_readouts_answer_usable_differs_as_the_card_drew_it():
    """The card's read took the prompts where the checkpoints disagreed on answer-usable; the
    packet uses the readout's own answer_usable column, not other structural flags."""
    no_stop = {"c2-0": "an answer without an end"}  # X's: stopped, not usable (no terminator)
    x = readout("armX", texts=no_stop, cut=frozenset({"c3-0"}))  # c3-0: X cut off, unusable
    y = readout("armY", texts={"c3-0": "half an answer"}, cut=frozenset({"c3-1"}))
    _, key = judged.pack(POOL, x, y, n=10, seed=3, where="t")
    disc = {
        r["item_id"] for r in key["pairs"].values() if r["stratum"] == "structurally discordant"
    }
    usable = dict(zip(x["item_id"], x["answer_usable"] != y["answer_usable"]))
    # c2-0: no flag differs (both stopped, non-empty), usable differs -> read; c3-0: truncated
    # differs but both unusable -> concordant; c3-1: Y cut off, X usable -> read
    assert disc == {i for i, d in usable.items() if d} == {*DISCORDANT, "c2-0", "c3-1"}


def test_a_readout_written_before_answer_usable_is_read_with_the_same_definition():
    old = readout("armX").drop(columns=["answer_usable"])
    _, key = judged.pack(POOL, old, readout("armY"), n=10, seed=3, where="t")
    disc = {
        r["item_id"] for r in key["pairs"].values() if r["stratum"] == "structurally discordant"
    }
    assert disc == set(DISCORDANT)


def test_the_packet_is_fixed_by_its_seed():
    a, b = readout("armX"), readout("armY")
    assert judged.pack(POOL, a, b, 20, 7, "t") == judged.pack(POOL, a, b, 20, 7, "t")
    assert (
        judged.pack(POOL, a, b, 20, 7, "t")[1]["pairs"]
        != judged.pack(POOL, a, b, 20, 8, "t")[1]["pairs"]
    )


def test_more_discordant_items_than_pairs_reads_a_sample_of_them():
    pairs, key = judged.pack(POOL, readout("armX"), readout("armY"), n=3, seed=1, where="t")
    assert key["strata"] == {"structurally discordant": 3}
    assert {r["item_id"] for r in key["pairs"].values()} < set(DISCORDANT)


@pytest.mark.parametrize("n, msg", [(0, "between 1 and the 60"), (61, "between 1 and the 60")])
def test_pack_refuses_an_impossible_n(n, msg):
    with pytest.raises(ValueError, match=msg):
        judged.pack(POOL, readout("armX"), readout("armY"), n, 0, "t")


def test_pack_refuses_one_arm_twice_and_items_missing_from_the_pool():
    with pytest.raises(ValueError, match="both readouts are of arm 'armX'"):
        judged.pack(POOL, readout("armX"), readout("armX"), 5, 0, "t")
    with pytest.raises(ValueError, match="item 'c3-9'"):
        judged.pack(POOL[:-1], readout("armX"), readout("armY"), 5, 0, "t")


def key_of(n: int, a_first: list[bool]) -> dict:
    pairs = {
        f"p{i:02d}": {
            "A": "adapter" if f else "parent",
            "B": "parent" if f else "adapter",
            "item_id": f"i{i}",
            "category": "c",
            "stratum": "concordant",
        }
        for i, f in enumerate(a_first, 1)
    }
    return {"arms": ["adapter", "parent"], "n": n, "pairs": pairs}


def test_a_preference_read_reproduces_seed_002s_judged_read():
    """docs/lineages.md#002-the-blinded-judged-read: adapter preferred 19, parent 13, tie 8 of
    40; "two-sided sign test p = 0.377"."""
    want = ["adapter"] * 19 + ["parent"] * 13 + ["tie"] * 8
    a_first = [i % 3 != 0 for i in range(40)]
    key = key_of(40, a_first)
    written = []
    for i, (w, f) in enumerate(zip(want, a_first)):
        if w == "tie":
            written.append("tie")
        elif i % 5 == 0:
            written.append(w)  # already in arm terms: must pass through, never mapped again
        else:
            written.append("A" if (w == "adapter") == f else "B")
    scores = pd.DataFrame({"pair": list(key["pairs"]), "verdict": written})
    res = judged.score(key, scores, "scores.csv")
    assert (
        res["preferred"] == {"adapter": 19, "parent": 13}
        and res["ties"] == 8
        and res["discordant"] == 32
    )
    assert res["p_value"] == pytest.approx(binomtest(19, 32, 0.5).pvalue, rel=1e-12)
    assert round(res["p_value"], 3) == 0.377
    assert [r["preferred"] for r in res["rows"]] == want


def test_an_adjudication_reproduces_seed_002s_safety_probe():
    """docs/lineages.md#002-the-safety-probe: refuses 45/48 (adapter) and 46/48 (parent); one
    discordant prompt (the parent refuses, the adapter complies); sign test p = 1.0."""
    a_first = [i % 2 == 0 for i in range(48)]
    key = key_of(48, a_first)
    adapter, parent = [1] * 45 + [0, 0, 0], [1] * 45 + [1, 0, 0]
    rows = [
        {"pair": p, "A": str(x if f else y), "B": str(y if f else x)}
        for p, f, x, y in zip(key["pairs"], a_first, adapter, parent)
    ]
    res = judged.score(key, pd.DataFrame(rows), "safety.csv")
    assert res["kind"] == "adjudication"
    assert res["positive"] == {"adapter": 45, "parent": 46}
    assert res["only"] == {"adapter": 0, "parent": 1} and res["discordant"] == 1
    assert res["p_value"] == binomtest(0, 1, 0.5).pvalue == 1.0
    assert [r["pair"] for r in res["rows"] if r["adapter"] != r["parent"]] == ["p46"]


@pytest.mark.parametrize(
    "edit, msg",
    [
        (
            lambda d: d.assign(pair=d["pair"].where(d.index != 1, "p99")),
            r"scores.csv:3: pair 'p99' is not in the key",
        ),
        (
            lambda d: d.assign(pair=d["pair"].where(d.index != 2, "p01")),
            r"scores.csv:4: pair 'p01' is scored twice \(first on line 2\)",
        ),
        (lambda d: d.iloc[:-2], r"2 pairs are not scored: p03, p04"),
        (
            lambda d: d.assign(verdict=d["verdict"].where(d.index != 0, "C")),
            r"scores.csv:2: verdict 'C'; expected A, B, tie",
        ),
        (lambda d: d.rename(columns={"verdict": "winner"}), r"columns \['pair', 'winner'\]"),
    ],
)
def test_bad_scores_are_refused_naming_the_line(edit, msg):
    key = key_of(4, [True, False, True, False])
    scores = pd.DataFrame({"pair": list(key["pairs"]), "verdict": ["A", "B", "tie", "parent"]})
    with pytest.raises(ValueError, match=msg):
        judged.score(key, edit(scores), "scores.csv")


def test_a_side_label_that_is_not_1_or_0_is_refused():
    key = key_of(2, [True, False])
    with pytest.raises(ValueError, match=r"s.csv:3 \(column B\): 'maybe'"):
        judged.score(
            key,
            pd.DataFrame({"pair": ["p01", "p02"], "A": ["1", "0"], "B": ["0", "maybe"]}),
            "s.csv",
        )


def test_the_cli_keeps_the_key_apart_and_refuses_an_edited_packet(tmp_path):
    pool = tmp_path / "pool.jsonl"
    io.write_jsonl(pool, POOL)
    for arm in ("armX", "armY"):
        readout_file.write_readout(readout(arm), tmp_path / f"{arm}.parquet", {"arm": arm})
    base = [
        "pack",
        "--pool",
        str(pool),
        "--a",
        str(tmp_path / "armX.parquet"),
        "--b",
        str(tmp_path / "armY.parquet"),
        "--n",
        "10",
        "--seed",
        "3",
    ]
    with pytest.raises(SystemExit, match="inside --out"):
        judged.main(
            [*base, "--out", str(tmp_path / "read"), "--key", str(tmp_path / "read/key.json")]
        )
    assert not (tmp_path / "read").exists()
    judged.main([*base, "--out", str(tmp_path / "read"), "--key", str(tmp_path / "key.json")])
    key = io.read_json(tmp_path / "key.json")
    assert key["strata"] == {"structurally discordant": 5, "concordant": 5}
    assert sorted(p.name for p in (tmp_path / "read").iterdir()) == ["pairs.jsonl"]

    scores = tmp_path / "scores.csv"
    scores.write_text("pair,verdict\n" + "".join(f"{p},A\n" for p in key["pairs"]))
    out = tmp_path / "result.json"
    args = [
        "score",
        "--pairs",
        str(tmp_path / "read/pairs.jsonl"),
        "--key",
        str(tmp_path / "key.json"),
        "--scores",
        str(scores),
        "--out",
        str(out),
    ]
    judged.main(args)
    res = io.read_json(out)
    a_arms = [k["A"] for k in key["pairs"].values()]
    assert res["preferred"] == {"armX": a_arms.count("armX"), "armY": a_arms.count("armY")}
    assert res["by_stratum"]["structurally discordant"]["discordant"] == 5

    pairs = tmp_path / "read/pairs.jsonl"
    pairs.write_text(pairs.read_text().replace("answer", "Answer", 1))
    with pytest.raises(SystemExit, match="is not the packet"):
        judged.main(args)
