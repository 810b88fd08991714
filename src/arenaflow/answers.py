"""Reading a completion's answer: where its final answer is and what it says, before any
judging (arenaflow.verify compares what this reads with gold). Kept apart from the verdict
because it is plain text work (regular expressions, no sympy): a change to how an answer is found
is reviewed and tested here on its own, and bumps verify.RULE where it changes a verdict.

Extraction (extract_answer, final): the last final statement, whichever starts last of a run of
\\boxed{} (boxes joined only by "and", "or" or commas, as in "$x = \\boxed{2}$ and
$x = \\boxed{3}$", are one list answer "2, 3"), an answer statement ("The answer is X",
"Answer: X", Minerva's "The final answer is $X$. I hope it is correct.") or a "####" line, so a
corrected answer after a box wins; else the last number, inline math or run of solutions
("x = -3 and x = 3" is "-3, 3"). A statement is cut at the end of its sentence and to the result
of a chain like "20 - 2 = 18"; values joined by and/or are a list ("18 or maybe 20" is "18, 20");
a sentence with one number is that number with its unit ("There are 9 eggs left"); one with
words alone ("the answer is correct") states no answer and is passed over. "$3 \\times 12 =
36$" is math, "$5 + $3" two prices; "!" after a number ends a sentence in text and is a
factorial in math. A different value offered after the answer ("18, or maybe 20", "it might be
20") is returned beside it, for the verdict to judge the answer a hedge.

Reading (normalise, as_number, to_number, number_word): formatting stripped, never value; an
answer that is one number read exactly (currency, thousands separators, a decimal comma, a
percent's hundredth, a magnitude word's product).
"""

from __future__ import annotations

import re
from fractions import Fraction

_STATEMENT = re.compile(r"\banswer(?:\s+is\b\s*:?|\s*[:=])", re.IGNORECASE)
_HASHES = re.compile(r"####")
_BOX_JOIN = re.compile(
    r"[\s$]*(?:,|and|or(?:\s+(?:maybe|perhaps|possibly))?|\\text\{\s*(?:,|and|or)\s*\}|\\q?quad)?"
    r"[\s$]*(?:[A-Za-z]\s*=\s*)?",
    re.IGNORECASE,
)
# Where a stated answer ends: a sentence stop (not a decimal point, "approx." or "i.e."), an
# exclamation that is not a factorial ("5! = 120"), a clause after a comma or a conjunction, a
# parenthetical aside.
_STOP = re.compile(
    r"(?<!approx)(?<!\bca)(?<!\bi\.e)(?<!\be\.g)\.(?=\s|$)|!(?!\s*=)|[?;]"
    r"|,\s+(?=[A-Za-z][a-z'.])|\s+\("
    r"|\s+(?=(?:since|because|as|which|so|but)\b)"
)
# Candidate math spans; _maths() keeps those that are math and not two prices.
_MATH = re.compile(
    r"\$\$(.+?)\$\$|\\\[(.+?)\\\]|\\\((.+?)\\\)|(?<![\\$])\$((?:\\\$|[^$\n])+?)(?<!\\)\$",
    re.DOTALL,
)
# An English word (not a LaTeX command's name): "$10 and $2" holds one, "$3 \times 12$" none.
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_NUMBER = re.compile(
    r"-?\\frac\{[^{}]*\}\{[^{}]*\}|-?\\frac\d\d"
    r"|(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+(?!\d)(?:\.\d+)?|\d+,\d{1,2}(?![\d,])|\d+(?:\.\d+)?|\.\d+)"
    r"(?:/\d+)?"
)
_FRAC = re.compile(r"^(-?)\\frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}$")
# Words after a number that make it a hedge or a range rather than a unit ("18 or 20 ...").
_NOT_UNITS = {"or", "and", "to", "not", "more", "less", "than", "plus", "minus", "times"}
# Words that keep a sentence answer from being read as its one number ("not 18", "at least 5").
_REFUSE = re.compile(
    r"\b(?:or|not|no|between|than|either|maybe|perhaps|possibly|least|most)\b", re.IGNORECASE
)
# A word of magnitude: "2.5 million" is 2500000, or 2.5 where the question counts in millions.
_MAGNITUDE = {
    "thousand": 10**3,
    "million": 10**6,
    "billion": 10**9,
    "trillion": 10**12,
    "dozen": 12,
}
# A whole answer that is one number: a sign before or after a currency sign, thousands
# separators or a decimal comma, then a percent or currency sign and up to five unit words
# ("18 dollars a day", "2.5 million"); "5x" and "5 x" are not numbers.
_WHOLE_NUMBER = re.compile(
    r"^(-?)\s*[$€£¥]?\s*(-?)\s*"
    r"(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+,\d{1,2}|\d+(?:\.\d+)?(?:/\d+)?|\.\d+)"
    r"\s*(%|[$€£¥])?((?:\s+(?:a|an|[A-Za-z][A-Za-z'.]+)){0,5})\s*[$€£¥]?$"
)
_EQUALS = re.compile(r"(?<![<>!\\])=")
# Several values in one answer: "-3 and 3", "x = 1, x = 2 or x = 3", "18 or maybe 20".
_JOIN = re.compile(
    r"\s*(?:,\s*(?:and|or)\b|,\s+|\band\b|\bor(?:\s+(?:maybe|perhaps|possibly))?\b)\s*",
    re.IGNORECASE,
)
_VAR = re.compile(r"^\$?\s*([A-Za-z])\s*=\s*")
_RUN_VALUE = r"-?(?:\\frac\{[^{}]*\}\{[^{}]*\}|\\sqrt\{[^{}]*\}|\d+(?:\.\d+)?(?:/\d+)?)"
# A run of solutions of one variable outside an answer statement: "x = -3 and x = 3".
_ASSIGN_RUN = re.compile(
    rf"\$?\s*\b([a-z])\s*=\s*{_RUN_VALUE}\s*\$?"
    rf"(?:\s*(?:,\s*(?:and|or)?|and|or)\s*\$?\s*\1\s*=\s*{_RUN_VALUE}\s*\$?)+"
)
# An alternative offered after the answer: "18, or maybe 20", "(or possibly 20)", "it might be 20".
_HEDGE = re.compile(
    r"\b(?:or|maybe|perhaps|possibly|might|could)\b"
    r"(?:\s+(?:maybe|perhaps|possibly|probably|also|even|just|be|it|it's|is|was))*\s*",
    re.IGNORECASE,
)
# The value of an alternative: a number with its sign, currency and percent, not the start of
# an expression ("or 2^3").
_ALTERNATIVE = re.compile(
    r"-?\s*[$€£¥]?\s*(?:" + _NUMBER.pattern + r")(?:\s*(?:\\?%|percent))?(?!\s*[\^*/+×\\]|\d)"
)
# The unit word after a number: "3 hours" -> "hours".
_UNIT = re.compile(r"[^A-Za-z]*?\d\s*([A-Za-z]{2,})")
_UNITS_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


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


def _boxed_run(text: str) -> tuple[int, int, str] | None:
    """(start, end, answer) of the last box with the boxes before it that only "and"/"or"/commas
    separate: one answer."""
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
    return run[0][0], run[-1][1], ", ".join(b[2] for b in run)


def _strip_markup(s: str) -> str:
    s = re.sub(r"\*\*|__|`", "", s).strip().strip("*_").strip()
    return s.replace("\u2212", "-")


def _is_math(m: re.Match) -> bool:
    """A $...$ span that opens with a digit or a space is math only without English words and
    without a dangling operator: "$3 \\times 12 = 36$" is, "$5 + $3" and "$10 and $2" are prices."""
    c = m.group(4)
    if c is None or not (c[0].isdigit() or c[0].isspace()):
        return True
    body = c.strip()
    return bool(
        body
        and not _WORD.search(c)
        and (c[0].isspace() or not c[-1].isspace())
        and body[-1] not in "+-*/=,:<>"
    )


def _maths(text: str, pos: int = 0):
    """The math spans of `text` from `pos` on; a rejected span's closing $ may open the next."""
    while (m := _MATH.search(text, pos)) is not None:
        if _is_math(m):
            yield m
            pos = m.end()
        else:
            pos = m.start() + 1


def _content(m: re.Match) -> str:
    return next(g for g in m.groups() if g is not None).strip()


def _leading_math(s: str) -> re.Match | None:
    """The math span that opens the string, if it is math and not a price."""
    m = next(_maths(s), None)
    return m if m is not None and m.start() == 0 else None


def _last_side(s: str) -> str:
    """The result of an equation chain ("20 - 2 = 18" -> "18"); lists ("a=1, b=2") stay whole."""
    parts = _EQUALS.split(s)
    is_list = re.search(r",(?!\d{3}(?!\d))", s)
    return parts[-1].strip() if len(parts) > 1 and not is_list and parts[-1].strip() else s


def _joined(s: str) -> str | None:
    """ "-3 and 3", "x = -3 or x = 3", "18 or maybe 20" as the list "-3, 3": values joined by
    and/or/commas, each a number or word-free math, assigned to one variable if any."""
    parts = _JOIN.split(re.sub(r"^(?:either|both)\s+", "", s, flags=re.IGNORECASE))
    if len(parts) < 2:
        return None
    names = {v.group(1) for v in map(_VAR.match, parts) if v}
    values = [_VAR.sub("", p).strip(" $") for p in parts]
    if len(names) > 1 or not all(
        v and (as_number(v) or not (_WORD.search(v) or re.search(r"[()\[\]]", v))) for v in values
    ):
        return None
    return ", ".join(values)


def number_word(s: str) -> str | None:
    """ "eighteen" -> "18", "twenty-four" -> "24" (a whole answer spelled out)."""
    tens, _, unit = s.lower().strip().partition("-")
    if tens in _UNITS_WORDS and not unit:
        return str(_UNITS_WORDS.index(tens))
    if tens in _TENS_WORDS and (not unit or unit in _UNITS_WORDS[1:10]):
        return str(20 + 10 * _TENS_WORDS.index(tens) + (_UNITS_WORDS.index(unit) if unit else 0))
    return None


def _answer_of(s: str) -> tuple[str | None, bool]:
    """(what a stated answer says, whether it is a sentence with several numbers): a number or
    math as written; a sentence's one number with its sign, currency and unit ("There are 9 eggs
    left" -> "9 eggs left"); a hedge, a negation or several numbers as written (to be judged
    wrong); a spelled-out number; None for words alone ("the answer is correct"), no answer."""
    s = s.strip()
    if not s or as_number(s, decimal_comma=True) or not _WORD.search(s):
        return s or None, False
    if _REFUSE.search(s):
        return s, False
    numbers = list(_NUMBER.finditer(s))
    if len(numbers) == 1:
        start = len(s[: numbers[0].start()].rstrip("$€£¥-\\ "))
        return s[start:].strip(), False
    return (s, True) if numbers else (s if number_word(s) else None, False)


def _stated(text: str, start: int) -> tuple[str, int, bool] | None:
    """(answer, end, several numbers) of the statement at `start` (after "The answer is"), cut
    at its sentence end; None when it states no answer."""
    line_end = text.find("\n", start)
    line = text[start : line_end if line_end >= 0 else len(text)]
    lead = len(line) - len(line.lstrip(" \t*_:`"))
    math = _leading_math(line[lead:])
    if math is not None:
        cut, answer = lead + math.end(), _content(math)
    else:
        stop = _STOP.search(line, lead)
        cut = stop.start() if stop else len(line)
        answer = _strip_markup(line[:cut]).rstrip(".")
    joined = _joined(answer)
    answer, several = (joined, False) if joined else _answer_of(_last_side(answer))
    return (answer, start + cut, several) if answer else None


def _last_number_or_math(text: str) -> str | None:
    """The last number, the last inline math, or the last run of solutions ("x = 2 and x = 3"),
    whichever ends last."""
    numbers, maths = list(_NUMBER.finditer(text)), list(_maths(text))
    runs = list(_ASSIGN_RUN.finditer(text))
    ends = [m[-1].end() for m in (numbers, maths) if m]
    if runs and runs[-1].end() >= max(ends):
        return _joined(runs[-1].group().replace("$", ""))
    if maths and (not numbers or maths[-1].end() >= numbers[-1].end()):
        return _last_side(_content(maths[-1])) or None
    return numbers[-1].group().rstrip(",") if numbers else None


def _alternatives(tail: str, answer: str) -> list[str]:
    """Values offered as alternatives in `tail`, the rest of the answer's line ("or maybe 20");
    a bare "or" before the same quantity in another unit restates it ("3 hours, or 180
    minutes")."""
    unit = _UNIT.search(answer)
    out = []
    for h in _HEDGE.finditer(tail):
        rest = tail[h.end() :]
        math = _leading_math(rest)
        if math is not None:
            out.append(_last_side(_content(math)))
            continue
        num = _ALTERNATIVE.match(rest)
        other = _UNIT.match(rest, num.start(), num.end() + 40) if num else None
        restated = h.group().strip().lower() == "or" and unit and other
        if num and not (restated and other.group(1).lower() != unit.group(1).lower()):
            out.append(num.group())
    return out


def final(text: str) -> tuple[str | None, list[str]]:
    """(answer, alternatives offered after it): the last final statement (a run of boxes, an
    answer statement or a "####" line, whichever starts last, so that a corrected answer after
    a box wins; statements that state no answer are passed over, and after a box so are sentences
    with several numbers, "the answer is found from 6 x 7"), else the last number or math."""
    text = text.replace("\u2212", "-")
    run = _boxed_run(text)
    best = (run[0], run[2], run[1]) if run else None
    for pattern in (_STATEMENT, _HASHES):
        for m in reversed(list(pattern.finditer(text))):
            if best is not None and m.start() <= best[0]:
                break
            stated = _stated(text, m.end())
            if stated and not (stated[2] and run):
                best = (m.start(), *stated[:2])
                break
    if best is None:
        return _last_number_or_math(text), []
    line_end = text.find("\n", best[2])
    tail = text[best[2] : line_end if line_end >= 0 else len(text)]
    return best[1], _alternatives(tail, best[1])


def extract_answer(text: str) -> str | None:
    """The final answer: the last of a run of boxes, an answer statement or a "####" line, else
    the last number, inline math or run of solutions."""
    return final(text)[0]


def normalise(s: str) -> str:
    """Formatting only, never value: markdown, math delimiters, LaTeX spacing and \\left/\\right,
    \\tfrac/\\dfrac, \\frac34, a trailing period (a "!" stays: 5! is a factorial)."""
    s = _strip_markup(s).rstrip(".").strip()
    whole = _leading_math(s)  # only a span that is the whole answer: "$2$ and $3$" stays
    s = _content(whole) if whole and whole.end() == len(s) else s
    s = re.sub(r"(?<!\\)\\[!,;: ]|\\left|\\right", "", s).replace("{,}", ",")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    return s.strip().rstrip(".").strip()


def as_number(s: str, decimal_comma: bool = False) -> tuple[tuple[Fraction, ...], str] | None:
    """(readings, plain token) of an answer that is one number, or None. A percent reads as the
    number and as its hundredth (12.5% answers 12.5 and 1/8), a magnitude word as the number and
    its product (3 dozen answers 36, and 3 where dozens are asked); "1,5" is 1.5 only with
    `decimal_comma` (never for a list gold)."""
    s = normalise(s).replace("\\$", "$").replace("\\%", "%")
    s = re.sub(r"\\(?:text|mbox|mathrm)\{([^{}]*)\}", r" \1", s)
    s = re.sub(r"\^\{?\\circ\}?|°", "", s).strip()
    frac, whole = _FRAC.match(s.replace(" ", "")), _WHOLE_NUMBER.match(s)
    words = whole.group(5).lower().split() if whole else []
    if frac:
        token, scale = f"{frac.group(1)}{frac.group(2)}/{frac.group(3)}", 1
    elif whole and not _NOT_UNITS & set(words) and not (whole.group(1) and whole.group(2)):
        token = whole.group(1) + whole.group(2) + whole.group(3)
        if re.fullmatch(r"-?\d+,\d{1,2}", token):
            if not decimal_comma:
                return None
            token = token.replace(",", ".")
        token = token.replace(",", "")
        percent = whole.group(4) == "%" or words[:1] == ["percent"]
        scale = Fraction(1, 100) if percent else _MAGNITUDE.get(words[0] if words else "", 1)
    else:
        return None
    try:
        num, _, den = token.partition("/")
        value = Fraction(num) / Fraction(den or 1)
    except (ValueError, ZeroDivisionError):
        return None
    return (value, value * scale) if scale != 1 else (value,), token


def to_number(s: str) -> Fraction | None:
    """Parse an answer string as an exact number (as written, before any percent or magnitude
    word), or None."""
    n = as_number(s)
    return n[0][0] if n else None
