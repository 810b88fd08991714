"""arenaflow.answers (answer extraction) and arenaflow.verify (the strict and `correct`
verdicts), and agreement with a careful grader on hand-labelled completions
(tests/data/math_verdicts.jsonl)."""

from __future__ import annotations

import json
import threading
from fractions import Fraction
from importlib import metadata
from pathlib import Path

import pytest

from arenaflow import answers, verify

# --- extraction ---------------------------------------------------------------------------


def test_extract_takes_a_statement_after_a_box_but_not_a_later_number():
    # a final statement after a box is a corrected answer; a bare number after it is not
    text = r"We get \boxed{42}. The answer is 41. Also 40."
    assert answers.extract_answer(text) == "41"
    assert answers.extract_answer(r"We get \boxed{42}. Also 40.") == "42"
    # a statement that states no answer does not withdraw the box
    assert answers.extract_answer(r"\boxed{18}. Checking the answer is correct: yes.") == "18"


def test_extract_takes_the_last_boxed():
    assert answers.extract_answer(r"first \boxed{1}, then \boxed{2}") == "2"


def test_extract_boxed_with_nested_braces():
    assert answers.extract_answer(r"so \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"


def test_extract_answer_is_statement():
    assert answers.extract_answer("3 + 4 = 7. The answer is 7.") == "7"
    assert answers.extract_answer("the answer is: 12") == "12"


def test_extract_takes_the_last_answer_is_statement():
    assert answers.extract_answer("The answer is 5.\nWait. The answer is 6.") == "6"


def test_extract_falls_back_to_last_number():
    assert answers.extract_answer("We add 3 and 4 to get 7") == "7"
    assert answers.extract_answer("temperature drops to -5") == "-5"
    assert answers.extract_answer("It costs 2.50 in total") == "2.50"


def test_extract_last_number_drops_trailing_separator():
    # "the last number" of "= 7, so" is 7, not "7,"
    assert answers.extract_answer("3 + 4 = 7, so we are done") == "7"
    assert answers.extract_answer("the total is 1,234, as shown") == "1,234"


def test_extract_returns_none_without_any_answer():
    assert answers.extract_answer("I do not know.") is None
    assert answers.extract_answer("") is None


# --- parsing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value",
    [
        ("42", Fraction(42)),
        ("-3", Fraction(-3)),
        ("1,234", Fraction(1234)),
        ("$1,000", Fraction(1000)),
        ("0.75", Fraction(3, 4)),
        ("3/4", Fraction(3, 4)),
        (r"\frac{1}{2}", Fraction(1, 2)),
        (r"\dfrac{3}{4}", Fraction(3, 4)),
        ("42 apples", Fraction(42)),
    ],
)
def test_to_number_parses_exactly(text, value):
    assert answers.to_number(text) == value


@pytest.mark.parametrize("text", ["seven", "", r"\frac{1}{0}", "1/0"])
def test_to_number_gives_none_for_non_numbers_and_zero_denominators(text):
    assert answers.to_number(text) is None


# --- strict vs loose ----------------------------------------------------------------------


def test_exact_match_is_strict_and_loose():
    v = verify.check("3 + 4 = 7. The answer is 7.", "7")
    assert v == {"pred": "7", "strict": True, "correct": True, "loose": True, "by": "strict"}


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("The total is 1,234", "1234"),  # thousands separator
        (r"\boxed{$5}", "5"),  # dollar sign
        (r"\boxed{\frac{1}{2}}", "0.5"),  # latex fraction vs decimal
        ("The answer is 3/4.", "0.75"),  # plain fraction vs decimal
        ("The answer is 0.5.", "1/2"),  # decimal vs fraction gold
        ("The answer is 42 apples.", "42"),  # unit
        ("The answer is 0.3333333.", "1/3"),  # math-verify rounds floats to 6 places
    ],
)
def test_equal_numbers_in_other_forms_are_loose_but_not_strict(completion, gold):
    v = verify.check(completion, gold)
    assert v["loose"] is True
    assert v["strict"] is False


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("The answer is 41.", "42"),
        (r"\boxed{\frac{1}{3}}", "0.5"),
        ("The answer is 3/4.", "0.7"),
        ("The answer is 0.333.", "1/3"),  # 0.333 is not 0.333333 to 6 places
        ("The answer is -42.", "42"),
        ("I cannot tell.", "42"),
    ],
)
def test_wrong_answers_are_neither_strict_nor_loose(completion, gold):
    v = verify.check(completion, gold)
    assert v["strict"] is False
    assert v["loose"] is False


def test_strict_ignores_a_trailing_period_and_surrounding_space():
    assert verify.check(r"\boxed{ 42. }", " 42 ")["strict"] is True


def test_an_integer_gold_is_compared_exactly():
    # before: 1e-6 relative tolerance, so 10^7 + 5 "was" 10^7 and 10^6 + 0.5 "was" 10^6
    assert verify.check("The answer is 10000005.", "10000000")["correct"] is False
    assert verify.check("The answer is 1000000.5.", "1000000") == {
        "pred": "1000000.5",
        "strict": False,
        "correct": False,
        "loose": False,
        "by": "exact",
    }
    assert verify.check("The answer is 18.00 apples.", "18")["correct"] is True


def test_strict_implies_loose_even_for_non_numbers():
    v = verify.check(r"\boxed{x+1}", "x+1")
    assert v["strict"] is True and v["loose"] is True


def test_no_prediction_is_recorded_as_none():
    assert verify.check("no idea", "5") == {
        "pred": None,
        "strict": False,
        "correct": False,
        "loose": False,
        "by": None,
    }


# --- math-verify beside strict/loose --------------------------------------------------------


def test_math_verify_field_is_only_added_on_request():
    assert "math_verify" not in verify.check("The answer is 7.", "7")
    assert verify.check("The answer is 7.", "7", math_verify=True) == {
        "pred": "7",
        "strict": True,
        "correct": True,
        "loose": True,
        "by": "strict",
        "math_verify": True,
    }


@pytest.mark.parametrize(
    "completion, gold",
    [
        (r"so \boxed{\frac{1}{2}}", "0.5"),
        ("The total is 1,234 apples", "1234"),
        ("#### 72", "72"),
        (r"thus \boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),  # beyond the numeric parse
        (r"\boxed{1+x}", "x+1"),
        (r"\boxed{4\pi}", r"4\pi"),
    ],
)
def test_math_verify_accepts_equal_answers(completion, gold):
    assert verify.check(completion, gold, math_verify=True)["math_verify"] is True


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("The answer is 41.", "42"),
        (r"\boxed{3}", r"\frac{\sqrt{3}}{2}"),
        (r"\boxed{x+2}", "x+1"),
        ("no idea", "5"),
        ("", "5"),
    ],
)
def test_math_verify_rejects_wrong_answers(completion, gold):
    assert verify.check(completion, gold, math_verify=True)["math_verify"] is False


def test_math_verify_off_the_main_thread():
    # its timeouts use signal.alarm, which only the main thread may set
    import threading

    out = {}
    t = threading.Thread(target=lambda: out.update(v=verify.math_verify_equal(r"\boxed{6}", "6")))
    t.start()
    t.join()
    assert out["v"] is True


def test_boxed_extraction_matches_braces_to_any_depth():
    from arenaflow.answers import extract_answer

    assert extract_answer(r"so \boxed{\frac{\sqrt{3}}{2}} done") == r"\frac{\sqrt{3}}{2}"


def test_loose_comparison_refuses_answers_that_are_not_a_number():
    from arenaflow.verify import check

    assert not check(r"\boxed{3}", r"\frac{\sqrt{3}}{2}")["loose"]
    assert not check("2y", "2x")["loose"]
    assert check("so 12 apples", "12")["loose"] and check("75%", "75")["loose"]


# --- each defect a blind review found in the old `loose` verdict ---------------------------


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("The answer is **18**.", "18"),
        ("**The answer is 18.**", "18"),
        ("The answer is 42!", "42"),
        ("The answer is 20 - 2 = 18.", "18"),
        (r"The final answer is $-\frac{1}{2}$. I hope it is correct.", r"-\frac{1}{2}"),
        (r"\boxed{-0.5}", r"-\frac{1}{2}"),
        (r"\boxed{18.90}", r"\$18.90"),
        (r"\boxed{10000}", r"10,\!000"),
        (r"\boxed{\tfrac{3}{4}}", r"\frac{3}{4}"),
        (r"\boxed{\frac34}", r"\frac{3}{4}"),
    ],
)
def test_correct_answers_the_old_loose_verdict_rejected(completion, gold):
    assert verify.check(completion, gold)["correct"] is True


def test_a_non_integer_answer_is_not_an_integer_gold():
    # the old 1e-6 relative tolerance accepted this
    assert verify.check("The answer is 1000000.5.", "1000000")["correct"] is False
    assert verify.check(r"\boxed{1000000.5}", "1000000")["correct"] is False


# --- extraction ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, answer",
    [
        ("The answer is **18**.", "18"),
        ("**The answer is 18.**", "18"),
        ("The answer is 42!", "42"),
        ("The answer is 20 - 2 = 18.", "18"),  # the result of a chain
        ("The answer is 18, since 3 × 6 = 18.", "18"),  # a clause after a comma
        ("The answer is 18 (6 each for 3 kids).", "18"),  # a parenthetical aside
        ("The answer is not 18; it is 20.", "not 18"),  # cut, not reinterpreted
        (r"The final answer is $-\frac{1}{2}$. I hope it is correct.", r"-\frac{1}{2}"),
        (r"Therefore, the answer is $\$18.90$.", r"\$18.90"),  # math, not a price
        ("The answer is $10.", "$10"),  # a price, not math
        ("**Answer:** 42 cookies", "42 cookies"),
        ("#### 18\n\nNote: rounded to 2 decimal places.", "18"),  # #### before the last number
        ("The answer is \u22125.", "-5"),  # unicode minus
        (r"So the probability is $\frac{3}{4}$.", r"\frac{3}{4}"),  # last inline math
        (r"The area is $\pi r^2 = 25\pi$.", r"25\pi"),
        (r"We get $x = 3$, so there are 3 + 2 = 5 apples.", "5"),  # a number after the math
        ("Weng earns $0.2 per minute, so 50 minutes pay $10.", "10"),  # prices are not math
    ],
)
def test_extract_answer_forms(text, answer):
    assert answers.extract_answer(text) == answer


@pytest.mark.parametrize(
    "text, answer",
    [
        (r"The solutions are $x = \boxed{2}$ and $x = \boxed{3}$.", "2, 3"),
        (r"\boxed{2}, \boxed{3}", "2, 3"),
        (r"\boxed{\frac{1}{2}} \text{ or } \boxed{\frac{1}{3}}", r"\frac{1}{2}, \frac{1}{3}"),
        # boxes separated by reasoning are a withdrawn answer and its correction
        (r"First \boxed{5}. That is wrong: 6 x 4 = 24, so \boxed{6}.", "6"),
        (r"(a) \boxed{5}" "\n" r"(b) \boxed{7}", "7"),
    ],
)
def test_extract_joins_a_run_of_boxes_into_one_list(text, answer):
    assert answers.extract_answer(text) == answer


def test_several_boxed_roots_answer_a_list_gold():
    assert verify.check(r"$x = \boxed{2}$ and $x = \boxed{3}$", "3, 2")["correct"] is True
    assert verify.check(r"$x = \boxed{2}$", "2, 3")["correct"] is False
    assert verify.check(r"\boxed{2} or \boxed{3}", "2")["correct"] is False


# --- the realistic classes: what each reads, and its near miss ---------------------------


@pytest.mark.parametrize(
    "text, answer",
    [
        ("The answer is 18 dollars a day.", "18 dollars a day"),
        ("**Answer:** There are 9 eggs left.", "9 eggs left"),
        ("The answer is: they spent $28 in total.", "$28 in total"),
        ("The answer is approx. 31.4 cm.", "31.4 cm"),  # "approx." does not end the sentence
        ("I believe the answer is correct: 24.", "24"),
        ("Check that the answer is correct. 9 * 2 = 18, so 18.", "18"),  # no answer stated
        (r"\boxed{60}. Wait, 3 were broken, so the final answer is 60 - 3 = 57.", "57"),
        (r"\boxed{45}. Let me recheck: 9 × 5 = 45. Yes, the answer is right.", "45"),
        # after a box, a sentence with several numbers explains, it does not answer
        (r"$\boxed{42}$. Explanation: the answer is found from 6 × 7.", "42"),
        ("Answer: 180 miles in 3 hours", "180 miles in 3 hours"),  # without a box: as written
        ("So x=-3 and x=3.", "-3, 3"),
        (r"The solutions are $x = 2$ and $x = -5$.", "2, -5"),
        ("The answer is x = 1, x = 2 or x = 3.", "1, 2, 3"),
        ("The answer is either 12 or 15.", "12, 15"),
        (r"\boxed{64} or maybe \boxed{65}", "64, 65"),
        (r"The total is $3 \times 12 = 36$.", "36"),
        ("He pays $5 + $3 = $8 in total.", "8"),  # prices, not the math "5 + "
        ("The answer is $ 100 $.", "100"),
        ("The answer is 5!", "5"),  # an exclamation in text
        (r"The answer is $5!$.", "5!"),  # a factorial in math
        ("The answer is eighteen.", "eighteen"),
    ],
)
def test_extract_realistic_forms(text, answer):
    assert answers.extract_answer(text) == answer


@pytest.mark.parametrize(
    "completion, gold, correct",
    [
        ("The answer is 18 dollars a day.", "18", True),
        ("The answer is 5 hours and 30 minutes.", "5", False),  # 5.5 hours
        ("Answer: 180 miles in 3 hours", "3", False),  # two numbers: no guess
        ("The answer is 12.5%.", "12.5", True),
        ("The answer is 12.5%.", "0.125", True),  # the percent's value
        ("The answer is 1.25%.", "12.5", False),
        (r"\boxed{5!}", "120", True),
        (r"The answer is $4!$.", "4", False),
        ("The answer is 24!", "24", True),
        ("The answer is $2.5 million.", "2500000", True),
        ("The answer is 25 million.", "2500000", False),
        ("The answer is 3 dozen.", "36", True),
        ("The answer is 1.2 thousand.", "12000", False),
        ("The answer is -$5.", "-5", True),
        ("The answer is $-5.", "-5", True),
        ("The answer is $5.", "-5", False),
        ("The answer is 18.50$.", "18.5", True),
        ("Answer: 25 €", "25", True),
        ("The answer is 4,5 litres.", "4.5", True),
        ("The answer is 4,5.", "45", False),
        (r"\boxed{2,3}", "2, 3", True),  # a list gold: no decimal comma
        ("So x = -3 or x = 3.", "3", False),  # a set for a single gold
        ("So x=-3 and x=3.", "3, -3", True),
        ("The answer is 18, or maybe 20.", "18", False),
        ("I think the answer is 18, but it might be 20.", "18", False),
        (r"\boxed{18} (or possibly 20 if we count the weekend)", "18", False),
        ("The answer is 0.25 (or 25%).", r"\frac{1}{4}", True),  # the same value restated
        ("The answer is 8, or 2^3.", "8", True),  # an expression, not an alternative
        ("The answer is 3 hours, or 180 minutes.", "3", True),  # restated in another unit
        ("The answer is 18 dollars, or 20 dollars.", "18", False),  # the same unit: a hedge
        ("The answer is approximately 7.5 hours.", "7.5", True),
        ("The answer is about 8.", "7.5", False),
        ("The answer is eighteen.", "18", True),
    ],
)
def test_realistic_verdicts(completion, gold, correct):
    assert verify.check(completion, gold)["correct"] is correct


def test_a_hedge_is_named_and_never_strict():
    v = verify.check("The answer is 18. Or maybe 16, I'm not sure.", "18")
    assert v == {"pred": "18", "strict": False, "correct": False, "loose": False, "by": "hedged"}


# --- strict and correct -------------------------------------------------------------------


def test_strict_normalises_formatting_but_not_value():
    assert verify.check(r"\boxed{10,\!000}", "10,000")["strict"] is True
    assert verify.check(r"The answer is $\dfrac{3}{4}$.", r"\frac34")["strict"] is True
    assert verify.check(r"\boxed{-0.5}", r"-\frac{1}{2}")["strict"] is False
    assert verify.check(r"\boxed{10000}", "10,000")["strict"] is False
    assert verify.check(r"\boxed{$2$ and $3$}", "2")["strict"] is False  # not one math span


@pytest.mark.parametrize(
    "completion, gold, by",
    [
        ("The answer is 7.", "7", "strict"),
        ("The answer is $7.00.", "7", "exact"),
        (r"\boxed{-0.5}", r"-\frac{1}{2}", "exact"),  # two plain numbers, as fractions
        (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", "math-verify"),
        (r"\boxed{2 < x \le 5}", "(2,5]", "math-verify"),  # an inequality for an interval
    ],
)
def test_by_names_the_comparison_that_decided(completion, gold, by):
    v = verify.check(completion, gold)
    assert v["correct"] is True and v["by"] == by


def test_hedged_and_ranged_answers_are_wrong():
    # math-verify alone reads the first number after "answer" in each of these
    for text in (
        "The answer is 18 or 20.",
        "The answer is between 18 and 20.",
        "The answer is not 18; it is 20.",
        "The answer is 18 or more.",
    ):
        assert verify.check(text, "18")["correct"] is False, text
        assert verify.math_verify_equal(text, "18") is True, text
    assert answers.to_number("5x") is None and answers.to_number("5 x") is None


def test_numeric_fallback_only_where_math_verify_parses_nothing(monkeypatch):
    monkeypatch.setattr(verify, "_mv_parse", lambda answer: ())
    v = verify.check("The answer is 0.3333333.", "1/3")
    assert v["correct"] is True and v["by"] == "numeric"
    assert verify.check(r"\boxed{x+1}", "1+x") == {
        "pred": "x+1",
        "strict": False,
        "correct": False,
        "loose": False,
        "by": None,
    }


def test_check_off_the_main_thread():
    # math-verify's timeouts use signal.alarm, which only the main thread may set
    out = {}
    t = threading.Thread(
        target=lambda: out.update(v=verify.check(r"\boxed{\sqrt{8}}", r"2\sqrt{2}"))
    )
    t.start()
    t.join()
    assert out["v"]["correct"] is True and out["v"]["by"] == "math-verify"


def test_verifier_names_the_rule_and_math_verify_version():
    v = verify.verifier()
    assert v == {
        "rule": verify.RULE,
        "math_verify": metadata.version("math-verify"),
        "latex2sympy2_extended": metadata.version("latex2sympy2_extended"),
    }
    assert verify.meta([{"gold": "1"}, {"constraints": []}]) == {"verifier": v}
    assert verify.meta([{"constraints": []}, {"prompt": "p"}]) == {}


# --- agreement with a careful grader ------------------------------------------------------

LABELLED = Path(__file__).resolve().parents[1] / "data" / "math_verdicts.jsonl"
FORMS = {
    "statement",
    "gsm8k",
    "markdown",
    "currency",
    "thousands",
    "negative",
    "fraction",
    "latex",
    "units",
    "interval",
    "boxed",
    # realistic completions of the classes a blind review found failing
    "unit-noun",
    "percent-decimal",
    "factorial",
    "boxed-corrected",
    "magnitude",
    "currency-sign",
    "decimal-comma",
    "latex-spaces",
    "equation-set",
    "hedge",
    "word-answer",
}


def _math_verify_alone(completion: str, gold: str) -> tuple[bool, bool]:
    """math-verify's own extraction from the completion against parse(gold) and against
    parse("\\boxed{gold}"): the completion is parsed once for both."""
    from math_verify import parse
    from math_verify import verify as mv_verify

    p = parse(completion)
    return tuple(
        bool(g and p and mv_verify(g, p)) for g in (parse(gold), parse("\\boxed{" + gold + "}"))
    )


def test_labelled_set_is_hand_written_and_covers_the_forms():
    rows = [json.loads(line) for line in LABELLED.read_text().splitlines()]
    assert len(rows) >= 150
    assert {r["form"] for r in rows} == FORMS
    assert all(isinstance(r["label"], bool) and r["note"] and "gold" in r for r in rows)
    # realistic-heldout was written and committed before the verdict was tuned on realistic-tune
    assert {r["split"] for r in rows} == {"dev", "heldout", "realistic-tune", "realistic-heldout"}
    assert len({(r["completion"], r["gold"]) for r in rows}) == len(rows)


SPLITS = ("dev", "heldout", "realistic-tune", "realistic-heldout")


def test_verdict_agrees_with_the_labels_at_least_as_often_as_math_verify_alone(record_property):
    """(a) check()["correct"], (b) math-verify alone: parse(completion) against parse(gold), and
    against parse("\\boxed{gold}") (kinder to LaTeX golds); agreement and false positives per
    split. Ours agrees at least as often as either and has no more false positives than either on
    every split, and none on the old splits (dev, heldout)."""
    rows = [json.loads(line) for line in LABELLED.read_text().splitlines()]
    alone = [_math_verify_alone(r["completion"], r["gold"]) for r in rows]
    graders = {
        "arenaflow": [verify.check(r["completion"], r["gold"])["correct"] for r in rows],
        "math-verify": [a[0] for a in alone],
        "math-verify-boxed-gold": [a[1] for a in alone],
    }
    score = {}
    for name, grades in graders.items():
        verdicts = [(v, r["label"], r["split"]) for v, r in zip(grades, rows)]
        score[name] = {
            split: {
                "n": sum(s == split for *_, s in verdicts),
                "agree": sum(v == lab for v, lab, s in verdicts if s == split),
                "false_pos": sum(v and not lab for v, lab, s in verdicts if s == split),
            }
            for split in SPLITS
        }
        record_property(name, json.dumps(score[name]))
    print(f"\n{'grader':<24}" + "".join(f"{s:>26}" for s in SPLITS))
    for name, by_split in score.items():
        cells = (f"{c['agree']}/{c['n']} agree, {c['false_pos']} FP" for c in by_split.values())
        print(f"{name:<24}" + "".join(f"{c:>26}" for c in cells))
    ours = score["arenaflow"]
    for split in SPLITS:
        if not split.startswith("realistic"):
            assert ours[split]["false_pos"] == 0, (split, score)
        for name in ("math-verify", "math-verify-boxed-gold"):
            assert ours[split]["agree"] >= score[name][split]["agree"], (split, name, score)
            assert ours[split]["false_pos"] <= score[name][split]["false_pos"], (split, name, score)
