"""arenaflow.evals.degeneracy: rep_ratio, the 8-gram uniqueness filter and the per-sample flags."""

from __future__ import annotations

import json

import pytest

from arenaflow.evals import degeneracy as dg


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


# --- rep_ratio ------------------------------------------------------------------------------


def test_rep_ratio_of_distinct_words_is_zero():
    assert dg.rep_ratio(words(50)) == 0.0


def test_rep_ratio_shorter_than_n_is_zero():
    assert dg.rep_ratio("a a a a a", n=6) == 0.0
    assert dg.rep_ratio("") == 0.0


def test_rep_ratio_hand_computed_phrase_repeated_three_times():
    # a 7-token phrase x3 = 21 tokens -> 16 six-grams, 7 distinct -> 9 of 16 repeat an earlier one
    text = " ".join(["a b c d e f g"] * 3)
    assert dg.rep_ratio(text) == pytest.approx(9 / 16)


def test_rep_ratio_hand_computed_single_repeat():
    # 12 distinct tokens then the first 6 again: 18 tokens, 13 six-grams, one repeats
    toks = words(12).split()
    assert dg.rep_ratio(" ".join(toks + toks[:6])) == pytest.approx(1 / 13)


def test_rep_ratio_counts_every_repeat_of_one_ngram():
    # "x" * 10: 5 six-grams, all equal -> 4 repeat an earlier one
    assert dg.rep_ratio(" ".join(["x"] * 10)) == pytest.approx(4 / 5)


def test_rep_ratio_is_case_and_punctuation_sensitive():
    assert dg.rep_ratio("A b c d e f a b c d e f") == pytest.approx(0.0)
    assert dg.rep_ratio("a b c d e f a b c d e f") == pytest.approx(1 / 7)


def test_rep_ratio_n_must_be_positive():
    with pytest.raises(ValueError):
        dg.rep_ratio("a b", n=0)


def test_loop_threshold_is_the_seeds_scorer_predicate():
    toks = words(25).split()
    # 25 distinct then the first 11 again: 36 tokens, 31 grams, the last 6 repeat: 0.19
    assert dg.rep_ratio(" ".join(toks + toks[:11])) == pytest.approx(6 / 31)
    assert not dg.is_loop(" ".join(toks + toks[:11]))
    # 24 distinct then the first 14 again: 38 tokens, 33 grams, 9 repeat: 0.27
    assert dg.rep_ratio(" ".join(toks[:24] + toks[:14])) == pytest.approx(9 / 33)
    assert dg.is_loop(" ".join(toks[:24] + toks[:14]))


def test_loop_at_exactly_a_quarter_counts():
    # L distinct tokens then the first m again: L + m - 5 grams, m - 5 repeats
    toks = words(10).split()
    quarter = " ".join(toks[:9] + toks[:8])  # 17 tokens, 12 grams, 3 repeats: exactly 0.25
    assert dg.rep_ratio(quarter) == 0.25
    assert dg.is_loop(quarter)
    below = " ".join(toks[:10] + toks[:8])  # 18 tokens, 13 grams, 3 repeats
    assert dg.rep_ratio(below) == pytest.approx(3 / 13)
    assert not dg.is_loop(below)


# --- ngram_unique_fraction ------------------------------------------------------------------


def test_unique_fraction_of_distinct_words_is_one():
    assert dg.ngram_unique_fraction(words(100)) == 1.0


def test_unique_fraction_short_text_is_one():
    assert dg.ngram_unique_fraction("a b c") == 1.0


def test_unique_fraction_hand_computed_period_four():
    # "a b c d" x 10 = 40 tokens; 8-grams at 0, 4, ..., 32 (9 of them) are all "a b c d a b c d"
    text = " ".join(["a b c d"] * 10)
    assert dg.ngram_unique_fraction(text) == pytest.approx(1 / 9)


def test_unique_fraction_stride_skips_positions():
    # 16 distinct tokens twice: 8-grams at 0, 4, ..., 24 (7); g16 = g0, g20 = g4, g24 = g8,
    # so 4 distinct of 7
    toks = words(16).split()
    assert dg.ngram_unique_fraction(" ".join(toks + toks)) == pytest.approx(4 / 7)
    # at stride 3 (0, 3, ..., 24: 9 grams) a repeat needs two positions 16 apart, both multiples
    # of 3: there are none, so every sampled gram is distinct
    assert dg.ngram_unique_fraction(" ".join(toks + toks), stride=3) == 1.0


def test_unique_fraction_args_must_be_positive():
    with pytest.raises(ValueError):
        dg.ngram_unique_fraction("a", stride=0)


# --- flags ------------------------------------------------------------------------------------


def test_flags_of_a_clean_stopped_answer_are_all_false():
    assert dg.flags("The answer is 42. It took three steps to get there.", stopped=True) == {
        "empty": False,
        "loop": False,
        "low_unique": False,
        "truncated": False,
        "fffd": False,
    }


def test_flags_each_condition():
    assert dg.flags("   \n", True)["empty"] is True
    assert dg.flags("ok", False)["truncated"] is True
    assert dg.flags("bad \ufffd byte", True)["fffd"] is True
    loop = " ".join(["we go round and round again"] * 6)
    f = dg.flags(loop, True)
    assert f["loop"] is True and f["low_unique"] is True


def test_the_two_filters_disagree_on_a_mild_repeat():
    # docs/lineages.md#000-two-repetition-measures: the scorer's loop (rep_ratio(6) >= 0.25)
    # and the builder's filter (8-gram uniqueness < 0.7) are different predicates: 40 distinct
    # then 20 repeated tokens
    toks = words(40).split()
    text = " ".join(toks + toks[:20])
    assert dg.rep_ratio(text) == pytest.approx(15 / 55)  # 60 tokens, 55 grams, 15 repeat
    assert dg.ngram_unique_fraction(text) == pytest.approx(10 / 14)  # grams at 0..52: 14, 4 repeat
    f = dg.flags(text, True)
    assert f["loop"] is True and f["low_unique"] is False


def test_cli_prints_flag_rates(tmp_path, capsys):
    p = tmp_path / "samples.jsonl"
    p.write_text(
        "\n".join(
            json.dumps(r)
            for r in [{"text": "fine answer", "stopped": True}, {"text": "", "stopped": False}]
        )
        + "\n"
    )
    dg.main(["--samples", str(p)])
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "samples": 2,
        "empty": 0.5,
        "loop": 0.0,
        "low_unique": 0.0,
        "truncated": 0.5,
        "fffd": 0.0,
    }
