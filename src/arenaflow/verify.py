"""Math answer verification: compare the answer arenaflow.answers reads from a completion with
gold, and record how the verdict was made.

Two verdicts per sample:
- strict: the extracted answer equals gold as a string after normalisation (markdown, math
  delimiters, LaTeX spacing commands, \\tfrac/\\dfrac, whitespace, a trailing period);
- correct (what corpora and readouts use): strict, or, when gold and answer are plain numbers
  (currency signs before or after a sign, thousands separators, a decimal comma for a one-number
  gold, unit words), a reading of the answer exactly equal to gold: the number, and for a
  percent its hundredth, for a magnitude word (thousand, million, billion, dozen) its product
  (1000000.5 is not 1000000); otherwise math-verify's parse/verify of the extracted answer
  against gold (sympy: intervals, sets, x+1 = 1+x, 5! = 120); only where math-verify parses no
  expression on a side, a numeric comparison within 1e-6 relative. An answer followed by a
  different value ("18, or maybe 20", "it might be 20") is a hedge, judged wrong. `by` names
  which of these decided; `loose` repeats `correct` for readers of the old name. `verifier()` is
  what stats.json and readout metadata record.
`check(..., math_verify=True)` adds math-verify alone on the whole completion (its own extraction)
under "math_verify", the baseline the verdict is measured against.
"""

from __future__ import annotations

import functools
import re
import threading
from fractions import Fraction

from arenaflow import answers

# Bump when extraction (arenaflow.answers) or comparison changes what `correct` means for some
# completion.
RULE = "arenaflow-math/3"


def _decimal(x: Fraction) -> str:
    """A reading as math-verify takes it: a terminating decimal, else p/q."""
    for places in range(13):
        scaled = x * 10**places
        if scaled.denominator == 1:
            digits = str(abs(scaled.numerator)).rjust(places + 1, "0")
            point = f"{digits[:-places]}.{digits[-places:]}" if places else digits
            return ("-" if x < 0 else "") + point
    return f"{x.numerator}/{x.denominator}"


def _timeout() -> int | None:
    # math-verify's timeouts use signal.alarm, which only the main thread may set
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _mv_parse(answer: str) -> tuple:
    """math-verify's parse of one answer, as LaTeX inside \\boxed{}; () when no expression parses.
    Only the LaTeX extractor: its plain-number fallback would read "between 10 and 20" as 20."""
    from math_verify import LatexExtractionConfig, parse
    from sympy import Basic, MatrixBase

    try:
        parsed = parse(
            "\\boxed{" + answer + "}",
            extraction_config=[LatexExtractionConfig()],
            parsing_timeout=_timeout(),
        )
    except Exception:  # noqa: BLE001 - an unparsable answer falls back, it does not fail the job
        return ()
    return tuple(parsed) if any(isinstance(p, (Basic, MatrixBase)) for p in parsed) else ()


def _mv_equal(pred: str, gold: str) -> bool | None:
    """math-verify's verdict on two extracted answers; None where it parses no expression."""
    from math_verify import verify as mv_verify

    p, g = _mv_parse(pred), _mv_parse(gold)
    if not (p and g):
        return None
    try:
        # allow_set_relation_comp: "2 < x \\le 5" answers "(2, 5]" as a grader reads it
        return bool(
            mv_verify(list(g), list(p), allow_set_relation_comp=True, timeout_seconds=_timeout())
        )
    except Exception:  # noqa: BLE001 - a grader crash on odd text is a wrong answer
        return False


def compare(pred: str, gold: str) -> tuple[bool, str | None]:
    """(correct, by): for a plain-number gold and answer, a reading of the answer equal to gold
    (exact; an integer gold is decided here), else math-verify, else numeric within 1e-6
    relative where math-verify parses no expression."""
    b = answers.as_number(gold)
    a = answers.as_number(answers.number_word(pred) or pred, decimal_comma=b is not None)
    if a and b:
        if set(a[0]) & set(b[0]):
            return True, "exact"
        if all(x.denominator == 1 for x in b[0]):
            return False, "exact"
    tokens = [_decimal(x) for x in a[0]] if a else [answers.normalise(pred)]
    verdicts = [_mv_equal(t, b[1] if b else answers.normalise(gold)) for t in tokens]
    if any(v is not None for v in verdicts):
        return any(verdicts), "math-verify"
    if a and b:
        close = [abs(x - y) <= Fraction(1, 10**6) * max(1, abs(y)) for x in a[0] for y in b[0]]
        return any(close), "numeric"
    return False, None


def math_verify_equal(completion: str, gold: str) -> bool:
    """math-verify alone: its own extraction from the whole completion (last \\boxed{}, else the
    last LaTeX or plain expression) against gold, symbolically. False on any failure."""
    from math_verify import parse
    from math_verify import verify as mv_verify

    limit = _timeout()
    try:
        gold_parsed = parse("\\boxed{" + gold.strip() + "}", parsing_timeout=limit)
        pred_parsed = parse(completion, parsing_timeout=limit)
        return bool(
            gold_parsed
            and pred_parsed
            and mv_verify(gold_parsed, pred_parsed, timeout_seconds=limit)
        )
    except Exception:  # noqa: BLE001 - a grader crash on odd text is a wrong answer, not a job failure
        return False


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", answers.normalise(s))


def check(completion: str, gold: str, math_verify: bool = False) -> dict:
    """Per-sample verdict: the extracted answer `pred`, `strict`, `correct` (= `loose`) and `by`
    (strict | exact | math-verify | numeric | hedged | None); an answer followed by a different
    alternative ("18, or maybe 20") is wrong (by "hedged"); with math_verify=True also math-verify
    alone on the whole completion under "math_verify"."""
    pred, alternatives = answers.final(completion)
    strict = pred is not None and _squash(pred) == _squash(gold)
    if strict:
        correct, by = True, "strict"
    else:
        correct, by = compare(pred, gold) if pred is not None else (False, None)
    if correct and not all(compare(alt, gold)[0] for alt in alternatives):
        strict, correct, by = False, False, "hedged"
    out = {"pred": pred, "strict": strict, "correct": correct, "loose": correct, "by": by}
    if math_verify:
        out["math_verify"] = math_verify_equal(completion, gold)
    return out


def verifier() -> dict:
    """What decides `correct`, for stats.json and readout metadata: arenaflow's rule and the
    versions of math-verify and its LaTeX parser."""
    from importlib import metadata

    return {
        "rule": RULE,
        "math_verify": metadata.version("math-verify"),
        "latex2sympy2_extended": metadata.version("latex2sympy2_extended"),
    }


def meta(pool: list[dict]) -> dict:
    """{"verifier": verifier()} for a pool with math rows (gold), else {}: the record that
    corpora stats and readouts carry of how their math verdicts were made."""
    return {"verifier": verifier()} if any("gold" in r for r in pool) else {}
