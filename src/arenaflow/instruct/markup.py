"""What a reader sees in a markdown response, for arenaflow.instruct.check: code is code (no
bullets, highlights or placeholders in it), a horizontal rule is a rule (not a bullet, not a
paragraph), a table need not have outer pipes, "[1]" is a citation, and curly or full-width
punctuation is the punctuation it looks like.
"""

from __future__ import annotations

import re
import unicodedata

# curly and other typographic quotes read as the ASCII ones when matching words and phrases
_QUOTES = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u02bc": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u201f": '"',
    }
)
# the double quotation marks (Unicode names "... DOUBLE ... QUOTATION MARK"), curly and angled
DOUBLE_QUOTES = '"\u201c\u201d\u201e\u201f\u00ab\u00bb\u301d\u301e\u301f\uff02'
# characters that are the ASCII one under another script's or typography's form, beyond what
# NFKC folds (full-width ，！？；： and the small forms fold already)
_SAME_AS = {
    ",": "\u3001\u060c",  # ideographic (enumeration) comma, Arabic comma
    ";": "\u061b",
    "?": "\u061f",
    ".": "\u3002",
    "-": "\u2010\u2011",  # hyphen, non-breaking hyphen (not the dashes)
    '"': DOUBLE_QUOTES,
    "'": "\u2018\u2019\u201a\u201b\u02bc",
}

_FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})")
_INLINE_CODE = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")
# a thematic break: three or more of one of - * _, spaces allowed between them
_RULE = re.compile(r"[ \t]{0,3}([-*_])(?:[ \t]*\1){2,}\s*")
_DELIM_CELL = re.compile(r"\s*:?-+:?\s*")
# [text] on one line; citations, footnotes, check boxes and link texts are told apart below
_BRACKETS = re.compile(r"\[([^\[\]\n]*\S[^\[\]\n]*)\]")
_CITATION = re.compile(r"\s*\d+(?:\s*[-\u2013,;]\s*\d+)*\s*")
_LIST_ITEM = re.compile(r"^[ \t]*(?:[-*+]|\d+[.)])[ \t]+\Z")


def fold(text: str) -> str:
    """`text` with compatibility forms (full-width letters and punctuation, the ellipsis
    character) and typographic quotes replaced by their plain forms."""
    return unicodedata.normalize("NFKC", text).translate(_QUOTES)


def is_forbidden(ch: str, chars: str) -> bool:
    """Whether `ch` is one of `chars` as a reader sees it (a full-width comma is a comma)."""
    return (
        ch in chars
        or unicodedata.normalize("NFKC", ch) in chars
        or any(ch in _SAME_AS.get(c, "") for c in chars)
    )


def is_rule(line: str) -> bool:
    return bool(_RULE.fullmatch(line))


def prose(text: str) -> str:
    """`text` with fenced code blocks (``` or ~~~, to the closing fence or the end) emptied and
    inline code spans blanked; lines keep their places."""
    out, fence = [], ""
    for line in text.split("\n"):
        m = _FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = ""
            out.append("")
        elif m and not (m.group(1)[0] == "`" and "`" in line[m.end() :]):
            # (a backtick fence's info string holds no backtick: ```json {..}``` is inline code)
            fence = m.group(1)
            out.append("")
        else:
            out.append(_INLINE_CODE.sub(lambda c: " " * len(c.group()), line))
    return "\n".join(out)


def _cells(line: str) -> list[str]:
    s = line.strip()
    s = s[1:] if s.startswith("|") else s
    s = s[:-1] if s.endswith("|") and not s.endswith("\\|") else s
    return re.split(r"(?<!\\)\|", s)


def _is_delimiter_row(line: str, header: str) -> bool:
    """A GFM delimiter row under `header`: |-separated cells of dashes (colons for alignment),
    outer pipes optional, as many cells as the header."""
    if "|" not in line or "|" not in header:
        return False
    cells = _cells(line)
    return all(_DELIM_CELL.fullmatch(c) for c in cells) and len(cells) == len(_cells(header))


def table_body_rows(text: str) -> tuple[int, int]:
    """(tables, body rows over all tables): a table is a header line and a delimiter row, then
    its body: the following lines with a |, up to a blank line or a line without one."""
    lines = prose(text).split("\n")
    tables = rows = 0
    i = 0
    while i + 1 < len(lines):
        if _is_delimiter_row(lines[i + 1], lines[i]):
            tables += 1
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows += 1
                i += 1
        else:
            i += 1
    return tables, rows


def placeholders(text: str) -> list[str]:
    """The [placeholder]s of `text` outside code: not citations ([1], [2, 3], [5-7]), footnote
    markers ([^1]), task-list boxes ([x] after a list marker), link texts ([docs](url),
    [docs][ref]) or reference definitions ([ref]: url)."""
    found = []
    for m in _BRACKETS.finditer(prose(text)):
        inner, before, after = m.group(1), m.string[: m.start()], m.string[m.end() :]
        if _CITATION.fullmatch(inner) or inner.startswith("^") or after[:1] in ("(", "["):
            continue
        if inner.strip() in ("x", "X") and _LIST_ITEM.search(before):
            continue
        if after.startswith(":") and re.search(r"(?:^|\n)[ \t]*\Z", before):
            continue
        found.append(inner)
    return found
