"""Instruction-constraint checker: does a response satisfy every checkable constraint of a prompt?

check(response, constraints) returns {"passed", "checks": [{"type", "passed", "reason"}]}: one
check per constraint (arenaflow.instruct.constraints), in order, with a human reason for each
failure ("word_eq: 37 words, expected 40") so failures can be tallied by checker reason
(docs/lineages.md#003-failure-analysis-by-checker-reason); passed only if every check passes.

    python -m arenaflow.instruct.check --constraints-json '[{"type": "word_eq", "n": 40}]' \
        < response.txt
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from arenaflow.instruct import markup
from arenaflow.instruct.constraints import _name, _plural, _quoted_list, validate

# Definitions (all exact, so a test can hand-compute them):
# Typography is read as a reader reads it (arenaflow.instruct.markup): curly quotes and
# apostrophes are quotes and apostrophes ("don’t" is the word don't, “...” is quoted),
# full-width and other scripts' punctuation is that punctuation (， and 、 are commas, 。 ！ ？
# end sentences), and code (``` / ~~~ fences, `inline`) holds no bullets, numbered items,
# highlights, placeholders or tables.
# - words are `response.split()`; word_times / contains / no_word match case-insensitively on
#   whole words (not inside a longer word), phrases allowed;
# - a sentence ends in a run of . ! ? … followed by whitespace or the end, or of 。 ！ ？ (which
#   need no space after them); closing quotes, brackets or markdown emphasis * _ may sit
#   between. A trailing fragment without a terminator counts as one more. A single "." (not
#   "..", "?!") does not end one after
#   * a title or Latin abbreviation that always has more after it (_NEVER_FINAL: Mr. Dr. Prof.
#     St. e.g. i.e. vs. P.S. ..., any case), or a single capital initial ("J. R. R. Tolkien");
#   * a list marker: a number or single letter alone at the start of a line ("1.", "a.");
#   * a reference abbreviation or month before a number (_BEFORE_NUMBER: "No. 5", "Sec. 3",
#     "pp. 10-12", "Oct. 14"; the answer "No. Then ..." ends one);
#   * a dotted abbreviation ("U.S.", "a.m.", "Ph.D.") or etc. Inc. Ltd. Co. Jr. Sr., when the
#     next word on the same line starts with a lowercase letter or a digit ("the U.S. economy"
#     is one sentence, "moved to the U.S. Then it" two);
#   decimals never end one ("3.5": no whitespace after the point). Rule-based on purpose: nltk's
#   punkt needs trained data that is not shipped, and a fixed rule can be hand-computed;
# - paragraphs are separated by blank lines, or, where the constraint names a `divider` (***),
#   by lines of that rule (* * * and **** too; --- is another rule); a horizontal rule line
#   (--- *** ___, spaced or not) is never a paragraph, nor a bullet; bullets are lines starting
#   "* " or "- ", numbered items lines starting "N. " (leading spaces allowed);
# - startswith / endswith compare the whitespace-stripped response, case-sensitively;
# - highlights count *text* and **text** spans with non-blank text on one line (as IFEval does);
# - placeholders are [text] on one line, but not citations ([1], [2, 3], [5-7]), footnote
#   markers ([^1]), task-list boxes (- [x]) or link texts ([docs](url));
# - postscript wants a line that starts with the marker, after any blockquote > and markdown
#   emphasis (`> P.S.`, `**P.S.**`, `*P.S. ...*`, `__P.S.__`), at the end: after its paragraph
#   only further postscripts (P.P.S.) may follow;
# - json_* accept the JSON alone, or wrapped in a ``` or ```json fence and nothing else around
#   it: the fences may share a line with the JSON (```json {"a": 1}```) and lines may end in CRLF;
#   NaN and Infinity are not JSON (Python's json.loads takes them; JSON.parse does not);
# - table_rows counts the body rows (after the delimiter row) of every GFM table; outer pipes
#   are optional ("a | b" over "--- | ---").

_CLOSERS = "\"'\u201c\u201d\u2018\u2019\u00ab\u00bb)\\]}\uff09\u300d\u300f\u3011*_"
# ideographic and full-width stops: no space follows them in CJK text
_WIDE_STOPS = "\u3002\uff01\uff1f\uff61"
_SENT_END = re.compile(
    rf"[.!?\u2026\u203c\u2047-\u2049]+[{_CLOSERS}]*(?=\s|$)|[{_WIDE_STOPS}]+[{_CLOSERS}]*"
)
# abbreviations that are always followed by more of their sentence (matched lowercased)
_NEVER_FINAL = frozenset(
    "mr mrs ms dr prof st mt rev fr gen col capt lt sgt hon vs e.g i.e cf viz "
    "approx fig p.s p.p.s".split()
)
# these end a sentence as often as not: the next word's case decides
_FINAL_IF_CAPITAL = frozenset("etc inc ltd co jr sr".split())
# references and months: not final before a number ("No. 5", "Sec. 3", "Oct. 14")
_BEFORE_NUMBER = frozenset(
    "no nos sec secs p pp vol vols ch chap art eq eqs fig figs tab ref refs pt pts para ed "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_DOTTED = re.compile(r"[A-Za-z]{1,2}(?:\.[A-Za-z]{1,2})+")  # U.S, a.m, Ph.D (without the last ".")
_LIST_MARKER = re.compile(r"(?:^|\n)[ \t]*(?:>[ \t]*)*(?:\d+|[A-Za-z])\Z")
_OPENERS = "\"'([*_`\u201c\u2018"
_BULLET = re.compile(r"[ \t]*[*-] ")
_NUMBERED = re.compile(r"^[ \t]*\d+\. ", re.MULTILINE)
_HIGHLIGHT = re.compile(r"\*\*([^\n*]*)\*\*|\*([^\n*]*)\*")
# a postscript's marker at a line's start, dressed in markdown; _ANY_PS: a later P.P.S. too
_PS_DRESS = r"^[ \t]*(?:>[ \t]*)*(?:\*{1,3}|_{1,3})?"
_ANY_PS = re.compile(_PS_DRESS + r"(?:P\.[ \t]?)+S\.")
_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}
# the body is everything between the fences; json.loads ignores the whitespace (CRLF too) around it
_FENCE = re.compile(r"^```(?:json|JSON|Json)?(.*?)```$", re.DOTALL)


def _occurrences(text: str, phrase: str) -> int:
    words = r"\s+".join(re.escape(w) for w in markup.fold(phrase).split())
    return len(re.findall(rf"(?<!\w){words}(?!\w)", markup.fold(text), flags=re.IGNORECASE))


def _ends_sentence(text: str, m: re.Match) -> bool:
    """Whether terminator match `m` ends a sentence (the abbreviation rules above)."""
    if m.group().rstrip(_CLOSERS) != ".":
        return True
    before = text[: m.start()]
    if _LIST_MARKER.search(before):
        return False
    word = re.search(r"\S*\Z", before).group().lstrip(_OPENERS)
    if word.lower() in _NEVER_FINAL or re.fullmatch(r"[A-Z]", word):
        return False
    nxt = re.match(r"[ \t]*(\S?)", text[m.end() :]).group(1)
    if word.lower() in _BEFORE_NUMBER and nxt.isdigit():
        return False
    if word.lower() in _FINAL_IF_CAPITAL or _DOTTED.fullmatch(word):
        return not (nxt.islower() or nxt.isdigit())
    return True


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, stripped, by the rule in the definitions above."""
    out, start = [], 0
    for m in _SENT_END.finditer(text):
        if _ends_sentence(text, m):
            out.append(text[start : m.end()].strip())
            start = m.end()
    if re.search(r"\w", text[start:]):
        out.append(text[start:].strip())
    return out


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


def count_paragraphs(text: str, divider: str | None = None) -> int:
    """Blank-line separated blocks of `text`, horizontal rules left out; or, with `divider` (a
    rule such as ***), the non-blank stretches between rules made of its character."""
    lines = text.split("\n")
    if divider is None:
        kept = "\n".join(line for line in lines if not markup.is_rule(line))
        return sum(1 for p in re.split(r"\n[ \t\r]*\n", kept) if p.strip())
    count, body = 0, ""
    for line in [*lines, divider]:
        if markup.is_rule(line) and line.strip()[0] == divider.strip()[0]:
            count, body = count + bool(body.strip()), ""
        else:
            body += line
    return count


def count_bullets(text: str) -> int:
    """Lines starting "* " or "- " outside code, horizontal rules ("* * *", "- - -") not."""
    lines = markup.prose(text).split("\n")
    return sum(1 for line in lines if _BULLET.match(line) and not markup.is_rule(line))


def count_highlights(text: str) -> int:
    pairs = _HIGHLIGHT.findall(markup.prose(text))
    return sum(1 for double, single in pairs if (double or single).strip())


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON value")


def _json(text: str):
    """(value, None) or (None, reason)."""
    s = text.strip()
    m = _FENCE.match(s)
    try:
        return json.loads(m.group(1) if m else s, parse_constant=_not_json), None
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    except ValueError as e:
        return None, f"not valid JSON ({e})"


def _count(family: str, have: int, want: int, unit: str, op: str) -> tuple[bool, str]:
    ok = {"==": have == want, ">=": have >= want, "<=": have <= want}[op]
    bound = {"==": "", ">=": "at least ", "<=": "at most "}[op]
    return ok, "" if ok else f"{family}: {_plural(have, unit)}, expected {bound}{want}"


# Families whose check is a count against c["n"]: (counter, unit, comparison).
_COUNTED = {
    "word_eq": (lambda text: len(text.split()), "word", "=="),
    "word_min": (lambda text: len(text.split()), "word", ">="),
    "word_max": (lambda text: len(text.split()), "word", "<="),
    "sent": (count_sentences, "sentence", "=="),
    "bullet": (count_bullets, "bullet", "=="),
    "numbered": (lambda text: len(_NUMBERED.findall(markup.prose(text))), "numbered item", "=="),
    "placeholders": (lambda text: len(markup.placeholders(text)), "placeholder", ">="),
    "highlights": (count_highlights, "highlighted section", ">="),
}


def _check_para(t: str, text: str, c: dict) -> tuple[bool, str]:
    return _count(t, count_paragraphs(text, c.get("divider")), c["n"], "paragraph", "==")


def _check_word_times(t: str, text: str, c: dict) -> tuple[bool, str]:
    k = _occurrences(text, c["word"])
    ok = k == c["n"]
    return (
        ok,
        "" if ok else f"word_times: {c['word']!r} appears {_plural(k, 'time')}, expected {c['n']}",
    )


def _check_contains(t: str, text: str, c: dict) -> tuple[bool, str]:
    missing = [w for w in c["words"] if not _occurrences(text, w)]
    return not missing, "" if not missing else f"contains: missing {_quoted_list(missing, 'and')}"


def _check_no_word(t: str, text: str, c: dict) -> tuple[bool, str]:
    found = [f"{w!r} x{k}" for w in c["words"] if (k := _occurrences(text, w))]
    return not found, "" if not found else f"no_word: found {', '.join(found)}"


def _check_no_chars(t: str, text: str, c: dict) -> tuple[bool, str]:
    if t == "no_digits":
        hits = re.findall(r"\d", text)
    else:
        hits = [ch for ch in text if markup.is_forbidden(ch, c["chars"])]
    what = "digit" if t == "no_digits" else "forbidden character"
    return (
        not hits,
        "" if not hits else f"{t}: {_plural(len(hits), what)} ({''.join(sorted(set(hits)))!r})",
    )


def _check_affix(t: str, text: str, c: dict) -> tuple[bool, str]:
    s, want = text.strip(), markup.fold(c["phrase"])
    ok = (markup.fold(s).startswith if t == "startswith" else markup.fold(s).endswith)(want)
    n = len(c["phrase"])
    seen = s[:n] if t == "startswith" else s[-n:]
    verb = "begins" if t == "startswith" else "ends"
    return ok, "" if ok else f"{t}: {verb} with {seen!r}, expected {c['phrase']!r}"


def _check_case(t: str, text: str, c: dict) -> tuple[bool, str]:
    # str.isupper/islower: at least one cased letter and none of the other case
    ok = text.isupper() if t == "is_upper" else text.islower()
    other = sum(ch.islower() if t == "is_upper" else ch.isupper() for ch in text)
    case = "lowercase" if t == "is_upper" else "uppercase"
    return ok, "" if ok else f"{t}: {_plural(other, case + ' letter')}" + (
        "" if other else " and no cased letter"
    )


def _check_quoted(t: str, text: str, c: dict) -> tuple[bool, str]:
    s = text.strip()
    ok = len(s) > 1 and s[0] in markup.DOUBLE_QUOTES and s[-1] in markup.DOUBLE_QUOTES
    return (
        ok,
        "" if ok else f"quoted: starts with {s[:1]!r} and ends with {s[-1:]!r}, expected '\"'",
    )


def _check_postscript(t: str, text: str, c: dict) -> tuple[bool, str]:
    # markdown dresses the marker up ("**P.S.**", "> P.S."); the line still starts with it
    marks = list(re.finditer(_PS_DRESS + re.escape(c["marker"]), text, flags=re.MULTILINE))
    if not marks:
        return False, f"postscript: no line starts with {c['marker']!r}"
    # the postscript runs to its paragraph's end; after it only more postscripts (P.P.S.)
    after = re.split(r"\n[ \t]*\n", text[marks[-1].end() :])[1:]
    rest = [p.strip() for p in after if p.strip() and not _ANY_PS.match(p.lstrip("\n"))]
    if rest:
        return False, f"postscript: text after the {c['marker']!r} postscript ({rest[0][:30]!r})"
    return True, ""


def _check_json(t: str, text: str, c: dict) -> tuple[bool, str]:
    value, err = _json(text)
    if err:
        return False, f"{t}: {err}"
    want = dict if t == "json_keys" else list
    if not isinstance(value, want):
        return False, f"{t}: top level is {_JSON_TYPES[type(value)]}, expected {_JSON_TYPES[want]}"
    if t == "json_array_len":
        return _count(t, len(value), c["n"], "item", "==")
    missing = [k for k in c["keys"] if k not in value]
    return (
        not missing,
        "" if not missing else f"json_keys: missing keys {_quoted_list(missing, 'and')}",
    )


def _check_table_rows(t: str, text: str, c: dict) -> tuple[bool, str]:
    tables, rows = markup.table_body_rows(text)
    if not tables:
        return False, "table_rows: no markdown table (a |-row followed by a |---| separator)"
    return _count(t, rows, c["n"], "body row", "==")


# The other families: family -> check(family, text, constraint) -> (passed, reason).
_CHECKS = {
    "para": _check_para,
    "word_times": _check_word_times,
    "contains": _check_contains,
    "no_word": _check_no_word,
    "no_char": _check_no_chars,
    "no_digits": _check_no_chars,
    "startswith": _check_affix,
    "endswith": _check_affix,
    "is_upper": _check_case,
    "is_lower": _check_case,
    "quoted": _check_quoted,
    "postscript": _check_postscript,
    "json_keys": _check_json,
    "json_array_len": _check_json,
    "table_rows": _check_table_rows,
}


def _check_one(text: str, c: dict) -> tuple[bool, str]:
    t = c["type"]
    if t in _COUNTED:
        counter, unit, op = _COUNTED[t]
        return _count(t, counter(text), c["n"], unit, op)
    if t in _CHECKS:
        return _CHECKS[t](t, text, c)
    raise AssertionError(f"family {t!r} has a spec but no check")  # pragma: no cover


def check(response: str, constraints: list[dict]) -> dict:
    """Check `response` against every constraint; unknown/malformed constraints raise ValueError."""
    if not isinstance(constraints, list) or not constraints:
        raise ValueError(f"constraints must be a non-empty list, got {_name(constraints)}")
    checks = []
    for c in constraints:
        passed, reason = _check_one(response, validate(c))
        checks.append({"type": c["type"], "passed": passed, "reason": reason})
    return {"passed": all(x["passed"] for x in checks), "checks": checks}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--constraints-json", required=True, help="a JSON list of constraint dicts")
    args = ap.parse_args(argv)
    result = check(sys.stdin.read(), json.loads(args.constraints_json))
    print(json.dumps(result, indent=2, ensure_ascii=False))
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
