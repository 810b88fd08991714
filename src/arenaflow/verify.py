"""Math answer verification: extract the final answer from a completion, compare with gold.

Two comparisons are recorded per sample, as the seeds report both:
- strict: the extracted answer string equals the gold string after trimming;
- loose: both parse as numbers (thousands separators, `$`, units and trailing `.` stripped,
  fractions `a/b` and `\\frac{a}{b}` evaluated) and agree within 1e-6 relative tolerance.
`check(..., math_verify=True)` adds a third, symbolic comparison by Hugging Face's math-verify
(`math_verify`: the completion's final answer equals gold as a sympy expression), which also
covers what the numeric parse cannot (`\\frac{\\sqrt{3}}{2}`, `x+1` vs `1+x`, intervals, sets).
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

_ANSWER_IS = re.compile(r"answer is[:\s]*\$?\s*([^\n]*?)\s*(?:\.\s|\.?$|\n)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_FRAC = re.compile(r"^\\d?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}$")
# A whole answer that is one number, optionally with a currency sign, a percent sign or a unit
# word ("12 apples"): anything else ("2x", "\\sqrt{3}") is not a number.
_WHOLE_NUMBER = re.compile(r"^\$?\s*(-?\d[\d,]*(?:\.\d+)?(?:/\d+)?)(?:\s*%|\s+[A-Za-z]+(?:\s+[A-Za-z]+)?)?\.?$")


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces matched to any depth."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i:j - 1].strip() if depth == 0 else None


def extract_answer(text: str) -> str | None:
    """The final answer: the last \\boxed{}, else the last "The answer is X", else the last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    stated = _ANSWER_IS.findall(text)
    if stated and stated[-1].strip():
        return stated[-1].strip()
    numbers = _NUMBER.findall(text)
    # _NUMBER admits commas (thousands separators), so "= 7, so" yields "7,": drop the separator
    return numbers[-1].rstrip(",") if numbers else None


def to_number(s: str) -> Fraction | None:
    """Parse an answer string as an exact number, or None."""
    s = s.strip().strip("$").strip()
    m = _FRAC.match(s.replace(" ", ""))
    if m:
        den = Fraction(m.group(2))
        return Fraction(m.group(1)) / den if den else None
    m = _WHOLE_NUMBER.match(s)
    if not m:
        return None
    token = m.group(1).replace(",", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return Fraction(num) / Fraction(den) if Fraction(den) else None
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def math_verify_equal(completion: str, gold: str) -> bool:
    """math-verify's verdict: the completion's final answer (its own extraction: last \\boxed{},
    else the last LaTeX or plain expression) equals gold symbolically. False on any failure."""
    from math_verify import parse
    from math_verify import verify as mv_verify

    # math-verify's timeouts use signal.alarm, which only the main thread may set
    main = threading.current_thread() is threading.main_thread()
    limit = 5 if main else None
    try:
        gold_parsed = parse("\\boxed{" + gold.strip() + "}", parsing_timeout=limit)
        pred_parsed = parse(completion, parsing_timeout=limit)
        return bool(gold_parsed and pred_parsed
                    and mv_verify(gold_parsed, pred_parsed, timeout_seconds=limit))
    except Exception:  # noqa: BLE001 - a grader crash on odd text is a wrong answer, not a job failure
        return False


def check(completion: str, gold: str, math_verify: bool = False) -> dict:
    """Per-sample verdict: extracted answer, strict and loose correctness, and (with
    math_verify=True) math-verify's symbolic verdict under the key "math_verify".
    """
    pred = extract_answer(completion)
    strict = pred is not None and pred.rstrip(".").strip() == gold.strip()
    loose = False
    if pred is not None:
        a, b = to_number(pred), to_number(gold)
        if a is not None and b is not None:
            loose = abs(a - b) <= Fraction(1, 10**6) * max(1, abs(b))
    out = {"pred": pred, "strict": bool(strict), "loose": bool(strict or loose)}
    if math_verify:
        out["math_verify"] = math_verify_equal(completion, gold)
    return out
