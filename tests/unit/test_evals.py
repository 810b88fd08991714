"""Readouts (reproducible, on the tiny model), pairing over replicates, levels and noise floors."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from arenaflow import engine, io, schema, verify
from arenaflow.evals import compare as comparisons
from arenaflow.evals import degeneracy, readout, readout_file, readout_rows


def frame(correct, prompts=None, cats=None):
    n = len(correct)
    return pd.DataFrame(
        {
            "item_id": [f"i{j}" for j in range(n)],
            "replicate": 0,
            "category": cats or ["a"] * n,
            "prompt_sha256": prompts or [f"p{j}" for j in range(n)],
            "target_sha256": [f"t{j}" for j in range(n)],
            "correct": correct,
        }
    )


def test_compare_counts_wins_losses_and_splits_by_category():
    cand = frame([1, 1, 0, 1, 0, 1], cats=["x", "x", "x", "y", "y", "y"])
    ref = frame([0, 1, 1, 0, 0, 1], cats=["x", "x", "x", "y", "y", "y"])
    res = comparisons.compare(cand, ref, "t")
    assert (res["wins"], res["losses"], res["ties_pass"], res["ties_fail"]) == (2, 1, 2, 1)
    assert res["delta"] == pytest.approx(100 * (4 - 3) / 6)
    assert res["by_category"]["x"]["wins"] == 1 and res["by_category"]["x"]["losses"] == 1
    assert res["by_category"]["y"]["wins"] == 1 and res["by_category"]["y"]["losses"] == 0


def test_compare_refuses_items_with_different_prompts():
    cand = frame([1, 0])
    ref = frame([1, 0], prompts=["p0", "other"])
    with pytest.raises(ValueError, match="'i1' has a different prompt"):
        comparisons.compare(cand, ref, "t")


def test_compare_refuses_items_read_out_on_one_side_only():
    with pytest.raises(ValueError, match="one side only"):
        comparisons.compare(frame([1, 0, 1]), frame([1, 0]), "t")


@pytest.mark.parametrize("bad", [np.nan, 2])
def test_compare_refuses_an_outcome_that_is_not_0_or_1_naming_the_readout(bad):
    # bool(nan) is True, so a NaN outcome used to count as a correct answer
    cand, ref = (
        frame([1, bad, 0]).assign(arm="B3", replicate=1),
        frame([1, 0, 0]).assign(arm="R2d", replicate=1),
    )
    with pytest.raises(
        ValueError,
        match=r"^cmp\.json: candidate B3 readouts \('correct'\): 1 of 3 outcomes are "
        rf"not 0/1, e\.g\. {bad} at item 'i1', replicate 1$",
    ):
        comparisons.compare(cand, ref, "cmp.json")
    with pytest.raises(
        ValueError, match=r"^cmp\.json: reference B3 readouts \('correct_ref'\): .* item 'i1'"
    ):
        comparisons.compare(cand.assign(correct=[1, 0, 0]), cand, "cmp.json")


def test_compare_and_noise_clis_name_the_readout_file_with_a_nan_outcome(tmp_path):
    good, bad = tmp_path / "A.r0.parquet", tmp_path / "A.r1.parquet"
    readout_file.write_readout(battery([1, 0, 1]), good, {})
    readout_file.write_readout(battery([1, np.nan, 1], replicate=1), bad, {})
    for argv in (
        ["compare", "--cand", str(bad), "--ref", str(good)],
        ["noise", "--readouts", str(good), str(bad)],
    ):
        with pytest.raises(
            ValueError, match=rf"^{bad} \('correct'\): 1 of 3 .* nan at item 'i1', replicate 1$"
        ):
            comparisons.main([*argv, "--out", str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()


def test_noise_refuses_an_outcome_that_is_not_0_or_1():
    df = pd.concat([battery([1, 0, 1], 0), battery([1, 0, 2], 1)], ignore_index=True)
    with pytest.raises(
        ValueError, match=r"^n\.json: A readouts \('correct'\): .* 2 at item 'i2', replicate 1$"
    ):
        comparisons.noise(df, "n.json")


# --- replicates, levels and the noise floor ------------------------------------------------


def battery(correct, replicate=0, arm="A", completions=None, stopped=None):
    n = len(correct)
    df = frame(correct).assign(replicate=replicate, arm=arm)
    df["completion"] = completions or ["1 + 2 = 3. The answer is 3."] * n
    df["n_tokens"] = [len(c) for c in df["completion"]]
    df["stopped"] = stopped if stopped is not None else [True] * n
    return readout_rows.structure(df)


def test_rep_ratio_is_one_minus_distinct_over_all_word_6grams():
    assert readout_rows.rep_ratio("a b c d e") == 0.0  # fewer than 6 words
    assert readout_rows.rep_ratio("a b c d e f g h") == 0.0  # 3 distinct 6-grams
    looped = " ".join(["the answer is 3 ."] * 4)  # 20 words, 15 6-grams, 5 distinct
    assert readout_rows.rep_ratio(looped) == pytest.approx(1 - 5 / 15)
    assert readout_rows.rep_ratio(looped) >= readout_rows.LOOP_AT


def test_structure_flags_truncated_empty_loop_and_fffd():
    texts = ["ok 1 + 1 = 2", "", " ".join(["go on and on ."] * 5), "bad \ufffd byte"]
    df = battery([1, 0, 0, 1], completions=texts, stopped=[True, True, False, True])
    assert df["truncated"].tolist() == [False, False, True, False]
    assert df["empty"].tolist() == [False, True, False, False]
    assert df["loop"].tolist() == [False, False, True, False]
    assert df["fffd"].tolist() == [False, False, False, True]
    assert df["n_words"].tolist() == [6, 0, 25, 3]
    lv = comparisons.levels(df)
    assert lv["accuracy"] == 50.0 and lv["truncation_rate"] == 25.0 and lv["loop_rate"] == 25.0
    assert lv["mean_words"] == pytest.approx(34 / 4)


def test_compare_pools_replicates_and_reports_each_and_the_t_over_replicates():
    from scipy import stats as sps

    cand_reps = [[1, 1, 1, 0, 1, 0, 1, 1], [1, 1, 0, 0, 1, 0, 1, 1], [1, 1, 1, 1, 1, 0, 1, 1]]
    ref_reps = [[1, 0, 1, 0, 1, 0, 0, 1], [1, 1, 0, 0, 0, 0, 1, 0], [1, 0, 1, 0, 1, 0, 1, 0]]
    cand = pd.concat([battery(c, r) for r, c in enumerate(cand_reps)], ignore_index=True)
    ref = pd.concat([battery(c, r) for r, c in enumerate(ref_reps)], ignore_index=True)
    res = comparisons.compare(cand, ref, "t")
    assert res["replicates"] == 3 and res["n"] == 24
    wins = sum(c and not r for cc, rr in zip(cand_reps, ref_reps) for c, r in zip(cc, rr))
    losses = sum(r and not c for cc, rr in zip(cand_reps, ref_reps) for c, r in zip(cc, rr))
    assert (res["wins"], res["losses"]) == (wins, losses)
    acc_c = [100 * sum(c) / 8 for c in cand_reps]
    acc_r = [100 * sum(r) / 8 for r in ref_reps]
    assert [b["delta"] for b in res["by_replicate"]] == pytest.approx(
        list(np.subtract(acc_c, acc_r))
    )
    assert res["t"] == pytest.approx(sps.ttest_rel(acc_c, acc_r).statistic, rel=1e-12)
    assert res["t_df"] == 2
    pooled_c = np.concatenate(cand_reps).astype(float)
    pooled_r = np.concatenate(ref_reps).astype(float)
    assert res["t_items"] == pytest.approx(sps.ttest_rel(pooled_c, pooled_r).statistic, rel=1e-12)
    assert res["levels"]["cand"]["accuracy"] == pytest.approx(res["accuracy"])
    assert res["words_delta"] == 0.0 and res["words_t"] is None


def test_compare_refuses_replicates_read_out_on_one_side_only():
    cand = pd.concat([battery([1, 0], 0), battery([1, 1], 1)], ignore_index=True)
    with pytest.raises(ValueError, match="one side only"):
        comparisons.compare(cand, battery([1, 0], 0), "t")


def test_noise_is_the_arm_against_itself_paired_by_item():
    from arenaflow.evals import stats

    reps = [[1, 1, 0, 1, 0, 1], [1, 0, 0, 1, 1, 1], [0, 1, 0, 1, 0, 1]]
    df = pd.concat([battery(c, r) for r, c in enumerate(reps)], ignore_index=True)
    res = comparisons.noise(df.sample(frac=1, random_state=0), "t")  # row order does not matter
    ref = stats.noise_floor(np.array(reps, bool))
    assert res["replicate_accuracies"] == pytest.approx(ref["replicate_accuracies"])
    assert res["mean_abs_delta"] == pytest.approx(ref["mean_abs_delta"])
    assert res["max_abs_t"] == pytest.approx(ref["max_abs_t"])
    assert res["replicate_ids"] == [0, 1, 2]


def test_noise_cli_needs_two_replicates_of_one_arm(tmp_path):
    p0, p1 = tmp_path / "a.r0.parquet", tmp_path / "b.r0.parquet"
    readout_file.write_readout(battery([1, 0, 1]), p0, {})
    readout_file.write_readout(battery([1, 0, 1], arm="B"), p1, {})
    with pytest.raises(SystemExit, match=">= 2 replicates"):
        comparisons.main(["noise", "--readouts", str(p0), "--out", str(tmp_path / "n.json")])
    with pytest.raises(SystemExit, match="one arm against itself"):
        comparisons.main(
            ["noise", "--readouts", str(p0), str(p1), "--out", str(tmp_path / "n.json")]
        )


# --- real readouts on the embedded tiny model ----------------------------------------------

POOL = [
    {"id": f"q{i}", "category": c, "prompt": p, "gold": g}
    for i, (c, p, g) in enumerate(
        [
            ("add", "Ann has 23 apples and gets 15 more. How many apples now?", "38"),
            ("sub", "Max had 41 cups and gave away 29. How many cups are left?", "12"),
            ("mul", "Ben buys 4 bags with 6 cards each. How many cards in all?", "24"),
            ("add", "Cal has 56 shells and gets 22 more. How many shells now?", "78"),
            ("sub", "Dee had 81 coins and gave away 27. How many coins are left?", "54"),
            ("mul", "Eve buys 7 boxes with 3 pens each. How many pens in all?", "21"),
        ]
    )
]


@pytest.fixture(scope="module")
def tiny_readout(tmp_path_factory, repo_root):
    d = tmp_path_factory.mktemp("readouts")
    pool = d / "pool.jsonl"
    io.write_jsonl(pool, POOL)
    sampled = json.dumps({"temperature": 0.8, "top_p": 1.0, "max_new_tokens": 24})

    def run(name, replicate=0, seed=0, regime=sampled, decoder="hf"):
        out = d / f"{name}.parquet"
        readout.main(
            [
                "readout",
                "--suite",
                "math",
                "--arm",
                "base",
                "--pool",
                str(pool),
                "--base-model",
                str(repo_root / "models/tiny-arith"),
                "--regime",
                "served",
                "--regime-json",
                regime,
                "--replicate",
                str(replicate),
                "--seed",
                str(seed),
                "--batch-size",
                "4",
                "--system-prompt",
                "You are a careful math tutor.",
                "--engine-json",
                json.dumps({"decoder": decoder}),
                "--out",
                str(out),
            ]
        )
        return out

    return run


def test_same_seed_gives_identical_readout_rows_and_shows_progress(tiny_readout, capsys):
    now = lambda: dt.datetime.now(dt.timezone.utc)  # noqa: E731
    before = now()
    a = tiny_readout("a")
    between = now()
    b = tiny_readout("b")
    after = now()
    err = capsys.readouterr().err
    assert "readout math/base/served.r0: 4/6 prompts" in err and "6/6 prompts" in err  # per batch
    da, db = pd.read_parquet(a), pd.read_parquet(b)
    pd.testing.assert_frame_equal(da, db)
    assert len(da) == len(POOL) and da["item_id"].tolist() == [r["id"] for r in POOL]
    # the metadata is read here from the parquet schema itself, not through readout_meta
    ma, mb = (json.loads(pq.read_schema(p).metadata[readout_file.META_KEY]) for p in (a, b))
    assert readout_file.readout_meta(a) == ma
    assert ma["seed"] == 0 and ma["decoding"]["temperature"] == 0.8
    assert ma["verifier"] == verify.verifier()  # a math pool
    # when each was made is recorded (a UTC time inside its own run), so it differs between the
    # two; their rows are still identical, so it is in the schema, not in the rows
    made = [dt.datetime.fromisoformat(m["created_utc"]) for m in (ma, mb)]
    assert before <= made[0] <= between <= made[1] <= after and made[0] < made[1]
    assert not {"created_utc", "code", "seconds"} & set(da.columns)  # what differs run to run


def test_replicates_decode_with_distinct_seeds_and_pair_by_item(tiny_readout):
    r0, r1 = tiny_readout("r0", replicate=0), tiny_readout("r1", replicate=1)
    m0, m1 = readout_file.readout_meta(r0), readout_file.readout_meta(r1)
    assert (m0["seed"], m1["seed"]) == (0, 1000)
    d0, d1 = pd.read_parquet(r0), pd.read_parquet(r1)
    assert d0["completion"].tolist() != d1["completion"].tolist()  # T=0.8, another seed
    # replicate 1 decodes with seed 0 + 1000 (not only records it): replicate 0 at seed 1000
    # reads out the same rows
    seeded = pd.read_parquet(tiny_readout("s1000", replicate=0, seed=1000))
    pd.testing.assert_frame_equal(seeded.drop(columns="replicate"), d1.drop(columns="replicate"))
    # each item carries the same prompt and target on both replicates, whatever the row order
    d1 = d1.sample(frac=1, random_state=0)
    keys = ["item_id", "prompt_sha256", "target_sha256"]
    assert sorted(map(tuple, d0[keys].to_numpy())) == sorted(map(tuple, d1[keys].to_numpy()))
    res = comparisons.noise(pd.concat([d0, d1], ignore_index=True), "t")
    assert res["k"] == 2 and res["n"] == len(POOL) and res["replicate_ids"] == [0, 1]
    accuracies = [100 * d["correct"].mean() for d in (d0, d1)]
    assert res["replicate_accuracies"] == pytest.approx(accuracies)


def test_the_static_engine_reads_out_the_same_greedy_rows_and_records_itself(tiny_readout):
    greedy = json.dumps({"temperature": 0.0, "max_new_tokens": 24})
    hf, static = (tiny_readout(f"g-{e}", regime=greedy, decoder=e) for e in ("hf", "static"))
    pd.testing.assert_frame_equal(pd.read_parquet(static), pd.read_parquet(hf))
    meta = [readout_file.readout_meta(r)["engine"] for r in (hf, static)]
    assert [m["decoder"] for m in meta] == ["hf", "static"]
    # every engine setting is recorded, the schema's defaults where the job set none
    assert {k: v for k, v in meta[1].items() if k != "decoder"} == {
        k: v for k, v in schema.schema_defaults("engine").items() if k != "decoder"
    }
    assert engine.settings() == schema.schema_defaults("engine")  # the job left nothing set


def test_one_process_reads_a_plan_of_regimes_and_replicates_as_separate_runs_do(
    tiny_readout, repo_root, tmp_path, capsys
):
    """readout_<suite> loads the model once for an arm's regimes x replicates: each file equals
    the one a process of its own writes (rows and the decoding, seed and regime recorded)."""
    greedy = {"temperature": 0.0, "max_new_tokens": 24}
    sampled = {"temperature": 0.8, "top_p": 1.0, "max_new_tokens": 24}
    reads = [("greedy", greedy, 0), ("served", sampled, 0), ("served", sampled, 1)]
    plan = [
        {"regime": g, "decoding": d, "replicate": r, "out": str(tmp_path / f"{g}.r{r}.parquet")}
        for g, d, r in reads
    ]
    pool = tmp_path / "pool.jsonl"
    io.write_jsonl(pool, POOL)
    capsys.readouterr()
    readout.main(
        ["readout", "--suite", "math", "--arm", "base", "--pool", str(pool), "--base-model"]
        + [str(repo_root / "models/tiny-arith"), "--plan", json.dumps(plan), "--seed", "0"]
        + ["--batch-size", "4", "--system-prompt", "You are a careful math tutor."]
    )
    assert capsys.readouterr().err.count("model loaded") == 1
    for (g, d, r), p in zip(reads, plan):
        alone = tiny_readout(f"alone-{g}{r}", replicate=r, regime=json.dumps(d))
        pd.testing.assert_frame_equal(pd.read_parquet(p["out"]), pd.read_parquet(alone))
        meta, want = readout_file.readout_meta(p["out"]), readout_file.readout_meta(alone)
        assert (meta["regime"], meta["decoding"], meta["seed"]) == (g, d, want["seed"])


def test_readout_scores_math_instruction_and_open_items_with_the_candidate_verdicts(repo_root):
    from arenaflow import models

    model, tok = models.load_policy(repo_root / "models/tiny-arith", None)
    apples = "Ann has 23 apples and gets 15 more. How many apples now?"
    pens, cups = (
        "Ann has 3 pens and gets 4 more. How many pens now?",
        "Ben has 5 cups and gets 2 more. How many cups now?",
    )
    pool = [
        {"id": "math-38", "category": "add", "prompt": apples, "gold": "38"},
        {"id": "math-83", "category": "add", "prompt": apples, "gold": "83"},  # a wrong gold
        {
            "id": "if-1",
            "category": "no_char",
            "prompt": pens,
            "constraints": [{"type": "no_digits"}],
        },
        {"id": "open-1", "category": "open", "prompt": cups, "min_chars": 0},
        {"id": "open-long", "category": "open", "prompt": cups, "min_chars": 200},
    ]
    df = readout_rows.readout(
        pool, model, tok, "", {"temperature": 0.0, "max_new_tokens": 48}, 0, 8, "t"
    )
    df = df.set_index("item_id")
    text = df["completion"]
    assert df["stopped"].all() and not (df["loop"] | df["empty"] | df["fffd"]).any()
    # math: right when the answer's last number is the gold (the tiny model answers
    # "... = 38. The answer is 38."), so one gold of the two is met
    last_number = text.map(lambda t: re.findall(r"-?\d+", t)[-1])
    gold = pd.Series({r["id"]: r["gold"] for r in pool if "gold" in r})
    expected = (last_number[gold.index] == gold).tolist()
    assert df.loc[gold.index, "correct"].tolist() == expected == [True, False]
    assert df.loc["math-38", "target_sha256"] == hashlib.sha256(b"38").hexdigest()
    # instruction following: the tiny model answers with digits, which the constraint forbids
    assert any(c.isdigit() for c in text["if-1"])
    assert not df.loc["if-1", "correct"] and "no_digits" in df.loc["if-1", "reasons"]
    # and its per-constraint verdicts, for the per-family table (arenaflow.instruct.families)
    assert json.loads(df.loc["if-1", "checks"]) == [{"type": "no_digits", "passed": False}]
    assert df.loc[["math-38", "open-1"], "checks"].isna().all()
    # lineage 002's structural reads, on every row (degeneracy.answer_usable, toolleak.leak)
    assert df["answer_usable"].tolist() == [
        degeneracy.answer_usable(t, s) for t, s in zip(text, df["stopped"])
    ]
    assert not df["tool_leak"].any()
    # open-ended: a clean stopped answer is right when it is long enough
    assert df.loc["open-1", "correct"]
    assert len(text["open-long"]) < 200 and not df.loc["open-long", "correct"]
    assert df["target_sha256"].nunique() == len(pool)


def test_compare_splits_the_structural_battery_by_category():
    cats = ["x", "x", "y", "y"]
    cand = battery(
        [1, 1, 0, 1], completions=["a b", "", "c d e", "f"], stopped=[True, True, False, True]
    )
    cand["category"] = cats
    ref = battery([1, 0, 0, 1])
    ref["category"] = cats
    res = comparisons.compare(cand, ref, "t")
    x, y = res["by_category"]["x"]["levels"], res["by_category"]["y"]["levels"]
    assert x["cand"]["empty_rate"] == 50.0 and y["cand"]["empty_rate"] == 0.0
    assert y["cand"]["truncation_rate"] == 50.0 and x["cand"]["truncation_rate"] == 0.0
    assert x["ref"]["empty_rate"] == 0.0


def test_compare_refuses_a_nan_word_count_naming_both_readouts():
    # a NaN n_words used to make words_t None and words_delta NaN in the compare file
    cand, ref = battery([1, 0, 1], arm="B3"), battery([1, 1, 0], arm="R2d")
    cand.loc[1, "n_words"] = np.nan
    with pytest.raises(
        ValueError,
        match=r"^cmp\.json: candidate B3 readouts vs cmp\.json: reference R2d readouts: words per "
        r"answer \('n_words' - 'n_words_ref'\): 1 of 3 values are not finite numbers, e\.g\. nan",
    ):
        comparisons.compare(cand, ref, "cmp.json")


def test_compare_and_noise_refuse_readouts_without_items_naming_them():
    empty = battery([1], arm="B3").iloc[:0]
    with pytest.raises(
        ValueError, match=r"^cmp\.json: candidate .*readouts \('correct'\): no outcomes"
    ):
        comparisons.compare(empty, empty, "cmp.json")
    with pytest.raises(ValueError, match=r"^n\.json: .*readouts: a noise floor needs .*K >= 2"):
        comparisons.noise(empty, "n.json")


def test_a_compare_file_with_a_nan_is_refused_before_a_bar_reads_it_naming_file_and_key(tmp_path):
    # files written before the statistics refused NaN may still hold one (JSON allows it)
    from arenaflow import manifest

    path = tmp_path / "B3__R2d.json"
    record = {"delta": 1.5, "readouts": {"cand": [], "ref": []}}
    record["by_replicate"] = [
        {"replicate": 0, "accuracy": 61.0},
        {"replicate": 1, "accuracy": np.nan},
    ]
    io.write_json(path, manifest.seal(record))
    with pytest.raises(ValueError, match=rf"^{path}: by_replicate\[1\]/accuracy is nan; recompute"):
        comparisons.verify_pooled(path)
    with pytest.raises(ValueError, match=r"^x\.json: t_p_value is inf"):
        comparisons.finite_record({"t": None, "t_p_value": float("inf")}, "x.json")
    assert comparisons.finite_record({"a": [1, 2.5, None, "s"]}, "x.json") == {
        "a": [1, 2.5, None, "s"]
    }
