"""Math answer verification: extract the final answer from a completion, compare it with gold.

Extraction (rule RULE): the last \\boxed{} (boxes joined only by "and", "or" or commas, as in
"$x = \\boxed{2}$ and $x = \\boxed{3}$", are one list answer "2, 3"); else the last answer
statement ("The answer is X", "Answer: X", Minerva's "The final answer is $X$. I hope it is
correct."); else the line after the last "####"; else the last number or inline math. A
statement is cut at the end of its sentence and to the result of a chain like "20 - 2 = 18";
markdown emphasis and math delimiters are dropped.

Two verdicts per sample:
- strict: the extracted answer equals gold as a string after normalisation (markdown, math
  delimiters, LaTeX spacing commands, \\tfrac/\\dfrac, whitespace, a trailing period);
- correct (what corpora and readouts use): strict, or, when gold is an integer and the answer a
  plain number, exact equality (1000000.5 is not 1000000); otherwise math-verify's parse/verify
  of the extracted answer against gold (sympy: -0.5 = -\\frac{1}{2}, intervals, sets, x+1 = 1+x);
  only where math-verify parses no expression on a side, a numeric comparison within 1e-6
  relative. `by` names which of these decided; `loose` repeats `correct` for readers of the old
  name. `verifier()` is what stats.json and readout metadata record.
`check(..., math_verify=True)` adds math-verify alone on the whole completion (its own extraction)
under "math_verify", the baseline the verdict is measured against.
"""

from __future__ import annotations

import functools
import re
import threading
from fractions import Fraction

# Bump when extraction or comparison changes what `correct` means for some completion.
RULE = "arenaflow-math/2"

_STATEMENT = re.compile(r"\banswer(?:\s+is\b\s*:?|\s*[:=])", re.IGNORECASE)
_HASHES = re.compile(r"####")
_BOX_JOIN = re.compile(
    r"[\s$]*(?:,|and|or|\\text\{\s*(?:,|and|or)\s*\}|\\q?quad)?[\s$]*"
    r"(?:[A-Za-z]\s*=\s*)?",
    re.IGNORECASE,
)
# Where a stated answer ends: a sentence stop (not a decimal point), a clause after a comma, a
# parenthetical aside.
_STOP = re.compile(r"\.(?=\s|$)|[!?;]|,\s+(?=[A-Za-z][a-z'])|\s+\(")
# Inline math whose content starts with a digit must be one token ("$18$"): "$10 ... $2" is two
# amounts of money, not math.
_MATH = re.compile(
    r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\\\((.+?)\\\)"
    r"|(?<![\\$])\$((?:[^\d\s$]|\\\$)(?:[^$\n]|\\\$)*?|\d[^\s$]*)(?<!\\)\$",
    re.DOTALL,
)
_NUMBER = re.compile(
    r"-?\\frac\{[^{}]*\}\{[^{}]*\}|-?\\frac\d\d"
    r"|(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:/\d+)?"
)
_FRAC = re.compile(r"^(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}$")
# Words after a number that make it a hedge or a range rather than a unit ("18 or 20 ...").
_NOT_UNITS = {"or", "and", "to", "not", "more", "less", "than", "plus", "minus", "times"}
# A whole answer that is one number: optional currency, thousands separators, then a percent
# sign or up to three unit words ("12 apples", "2.5 hours"); "5x" and "5 x" are not numbers.
_WHOLE_NUMBER = re.compile(
    r"^[$€£¥]?\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+)"
    r"(\s*%|(?:\s+[A-Za-z]{2,}){0,3})\s*$"
)
_EQUALS = re.compile(r"(?<![<>!\\])=")


def boxes(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every closed \\boxed{...} / \\fbox{...}, nested ones too, by start;
    braces matched to any depth in one pass (a looping completion may open thousands)."""
    out, stack, depth = [], [], 0
    for m in re.finditer(r"\\(?:boxed|fbox)\{|[{}]", text):
        if m.group() == "}":
            if stack and stack[-1][0] == depth:
                _, start, content = stack.pop()
                out.append((start, m.end(), text[content : m.start()].strip()))
            depth -= 1
        else:
            depth += 1
            if m.group() != "{":
                stack.append((depth, m.start(), m.end()))
    return sorted(out)


def _closed(text: str) -> list[tuple[int, int, str]]:
    """boxes(text), or [] when the last box opened is never closed (a cut-off answer)."""
    found = boxes(text)
    opened = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    return found if found and found[-1][0] == opened else []


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces matched to any depth."""
    found = _closed(text)
    return found[-1][2] if found else None


def _boxed_run(text: str) -> str | None:
    """The last box, with the boxes before it that only "and"/"or"/commas separate: one answer."""
    found = []
    for b in _closed(text):
        if not found or b[0] >= found[-1][1]:  # outermost boxes only
            found.append(b)
    if not found:
        return None
    run = [found[-1]]
    for prev in reversed(found[:-1]):
        if not _BOX_JOIN.fullmatch(text[prev[1] : run[0][0]]):
            break
        run.insert(0, prev)
    return ", ".join(b[2] for b in run)


def _strip_markup(s: str) -> str:
    s = re.sub(r"\*\*|__|`", "", s).strip().strip("*_").strip()
    return s.replace("\u2212", "-")


def _content(m: re.Match) -> str:
    return next(g for g in m.groups() if g is not None).strip()


def _leading_math(s: str) -> str | None:
    """The content of a math span that opens the string, if it is math and not a price."""
    m = _MATH.match(s)
    return _content(m) if m else None


def _last_side(s: str) -> str:
    """The result of an equation chain ("20 - 2 = 18" -> "18"); lists ("a=1, b=2") stay whole."""
    parts = _EQUALS.split(s)
    return parts[-1].strip() if len(parts) > 1 and "," not in s and parts[-1].strip() else s


def _stated(rest: str) -> str | None:
    """The answer at the start of `rest` (what follows "The answer is"), cut at its sentence end."""
    rest = _strip_markup(rest.split("\n", 1)[0])
    math = _leading_math(rest)
    if math is None:
        stop = _STOP.search(rest)
        math = _strip_markup(rest[: stop.start()] if stop else rest).rstrip(".")
    return _last_side(math) or None


def _last_number_or_math(text: str) -> str | None:
    """The last number, or the last inline math if nothing numeric follows it."""
    numbers, maths = list(_NUMBER.finditer(text)), list(_MATH.finditer(text))
    if maths and (not numbers or maths[-1].end() >= numbers[-1].end()):
        return _last_side(_content(maths[-1])) or None
    return numbers[-1].group().rstrip(",") if numbers else None


def extract_answer(text: str) -> str | None:
    """The final answer: the last run of boxes, else the last answer statement, else the last
    "####" line, else the last number or inline math."""
    text = text.replace("\u2212", "-")
    boxed = _boxed_run(text)
    if boxed is not None:
        return boxed
    for pattern in (_STATEMENT, _HASHES):
        starts = [m.end() for m in pattern.finditer(text)]
        stated = _stated(text[starts[-1] :]) if starts else None
        if stated:
            return stated
    return _last_number_or_math(text)


def normalise(s: str) -> str:
    """Formatting only, never value: markdown, math delimiters, LaTeX spacing and \\left/\\right,
    \\tfrac/\\dfrac, \\frac34, a trailing period or exclamation mark."""
    s = _strip_markup(s).rstrip(".!").strip()
    whole = _MATH.fullmatch(s)  # only a span that is the whole answer: "$2$ and $3$" stays
    s = _content(whole) if whole else s
    s = re.sub(r"(?<!\\)\\[!,;: ]|\\left|\\right", "", s).replace("{,}", ",")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    return s.strip().rstrip(".!").strip()


def _number(s: str) -> tuple[Fraction, str] | None:
    """(exact value, plain token) of an answer that is one number, or None."""
    s = normalise(s).replace("\\$", "$").replace("\\%", "%")
    s = re.sub(r"\\(?:text|mbox|mathrm)\{([^{}]*)\}", r" \1", s)
    s = re.sub(r"\^\{?\\circ\}?|°", "", s).strip()
    frac, whole = _FRAC.match(s.replace(" ", "")), _WHOLE_NUMBER.match(s)
    if frac:
        token, percent = f"{frac.group(1)}{frac.group(2)}/{frac.group(3)}", False
    elif whole and not _NOT_UNITS & set(whole.group(2).lower().split()):
        token, percent = whole.group(1).replace(",", ""), whole.group(2).strip() == "%"
    else:
        return None
    try:
        num, _, den = token.partition("/")
        value = Fraction(num) / Fraction(den or 1)
    except (ValueError, ZeroDivisionError):
        return None
    # the token keeps a percent sign for math-verify, which reads 50% against 0.5 as equal
    return value, token + ("\\%" if percent else "")


def to_number(s: str) -> Fraction | None:
    """Parse an answer string as an exact number, or None."""
    n = _number(s)
    return n[0] if n else None


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
    """(correct, by): exact for an integer gold and a plain-number answer, else math-verify,
    else numeric within 1e-6 relative where math-verify parses no expression."""
    a, b = _number(pred), _number(gold)
    if a and b and b[0].denominator == 1:
        return a[0] == b[0], "exact"
    verdict = _mv_equal(a[1] if a else normalise(pred), b[1] if b else normalise(gold))
    if verdict is not None:
        return verdict, "math-verify"
    if a and b:
        return abs(a[0] - b[0]) <= Fraction(1, 10**6) * max(1, abs(b[0])), "numeric"
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
    return re.sub(r"\s+", "", normalise(s))


def check(completion: str, gold: str, math_verify: bool = False) -> dict:
    """Per-sample verdict: the extracted answer `pred`, `strict`, `correct` (= `loose`) and `by`
    (strict | exact | math-verify | numeric | None); with math_verify=True also math-verify
    alone on the whole completion under "math_verify"."""
    pred = extract_answer(completion)
    strict = pred is not None and _squash(pred) == _squash(gold)
    if strict:
        correct, by = True, "strict"
    else:
        correct, by = compare(pred, gold) if pred is not None else (False, None)
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
