"""arenaflow.verify: answer extraction and strict/loose comparison with gold."""

from __future__ import annotations

from fractions import Fraction

import pytest

from arenaflow import verify

# --- extraction ---------------------------------------------------------------------------

def test_extract_prefers_boxed_over_later_statement_and_numbers():
    text = r"We get \boxed{42}. The answer is 41. Also 40."
    assert verify.extract_answer(text) == "42"


def test_extract_takes_the_last_boxed():
    assert verify.extract_answer(r"first \boxed{1}, then \boxed{2}") == "2"


def test_extract_boxed_with_nested_braces():
    assert verify.extract_answer(r"so \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"


def test_extract_answer_is_statement():
    assert verify.extract_answer("3 + 4 = 7. The answer is 7.") == "7"
    assert verify.extract_answer("the answer is: 12") == "12"


def test_extract_takes_the_last_answer_is_statement():
    assert verify.extract_answer("The answer is 5.\nWait. The answer is 6.") == "6"


def test_extract_falls_back_to_last_number():
    assert verify.extract_answer("We add 3 and 4 to get 7") == "7"
    assert verify.extract_answer("temperature drops to -5") == "-5"
    assert verify.extract_answer("It costs 2.50 in total") == "2.50"


def test_extract_last_number_drops_trailing_separator():
    # "the last number" of "= 7, so" is 7, not "7,"
    assert verify.extract_answer("3 + 4 = 7, so we are done") == "7"
    assert verify.extract_answer("the total is 1,234, as shown") == "1,234"


def test_extract_returns_none_without_any_answer():
    assert verify.extract_answer("I do not know.") is None
    assert verify.extract_answer("") is None


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
    assert verify.to_number(text) == value


@pytest.mark.parametrize("text", ["seven", "", r"\frac{1}{0}", "1/0"])
def test_to_number_gives_none_for_non_numbers_and_zero_denominators(text):
    assert verify.to_number(text) is None


# --- strict vs loose ----------------------------------------------------------------------

def test_exact_match_is_strict_and_loose():
    v = verify.check("3 + 4 = 7. The answer is 7.", "7")
    assert v == {"pred": "7", "strict": True, "loose": True}


@pytest.mark.parametrize(
    "completion, gold",
    [
        ("The total is 1,234", "1234"),  # thousands separator
        (r"\boxed{$5}", "5"),  # dollar sign
        (r"\boxed{\frac{1}{2}}", "0.5"),  # latex fraction vs decimal
        ("The answer is 3/4.", "0.75"),  # plain fraction vs decimal
        ("The answer is 0.5.", "1/2"),  # decimal vs fraction gold
        ("The answer is 42 apples.", "42"),  # unit
        ("The answer is 0.3333333.", "1/3"),  # within 1e-6 relative
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
        ("The answer is 0.333.", "1/3"),  # outside 1e-6 relative
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


def test_loose_tolerance_is_relative_for_large_gold():
    # 1e-6 relative of 10^7 is 10, so 10000005 vs 10000000 agrees, 10000020 does not
    assert verify.check("The answer is 10000005.", "10000000")["loose"] is True
    assert verify.check("The answer is 10000020.", "10000000")["loose"] is False


def test_strict_implies_loose_even_for_non_numbers():
    v = verify.check(r"\boxed{x+1}", "x+1")
    assert v["strict"] is True and v["loose"] is True


def test_no_prediction_is_recorded_as_none():
    assert verify.check("no idea", "5") == {"pred": None, "strict": False, "loose": False}


# --- math-verify beside strict/loose --------------------------------------------------------

def test_math_verify_field_is_only_added_on_request():
    assert "math_verify" not in verify.check("The answer is 7.", "7")
    assert verify.check("The answer is 7.", "7", math_verify=True) == {
        "pred": "7", "strict": True, "loose": True, "math_verify": True}


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
    from arenaflow.verify import extract_answer

    assert extract_answer(r"so \boxed{\frac{\sqrt{3}}{2}} done") == r"\frac{\sqrt{3}}{2}"


def test_loose_comparison_refuses_answers_that_are_not_a_number():
    from arenaflow.verify import check

    assert not check(r"\boxed{3}", r"\frac{\sqrt{3}}{2}")["loose"]
    assert not check("2y", "2x")["loose"]
    assert check("so 12 apples", "12")["loose"] and check("75%", "75")["loose"]
