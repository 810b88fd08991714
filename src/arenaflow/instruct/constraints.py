"""Instruction constraints: a constraint is a dict {"type": family, **params} of one of the
checkable FAMILIES. validate() normalises one or names what is wrong with it; describe() is the
instruction sentence a prompt carries for it. arenaflow.instruct.check checks responses against
them.
"""

from __future__ import annotations

import json
import re

# param kinds: "n" a non-negative int, "words" a non-empty list of non-empty strings (a single
# string is accepted as a list of one), "text" a non-empty string, "rule" a markdown horizontal
# rule (three or more of one of - * _, spaces allowed between them)
_SPECS: dict[str, tuple[dict[str, str], dict[str, tuple[str, object]]]] = {
    # family: ({required param: kind}, {optional param: (kind, default; None: left out)})
    "word_eq": ({"n": "n"}, {}),
    "word_min": ({"n": "n"}, {}),
    "word_max": ({"n": "n"}, {}),
    "word_times": ({"word": "text", "n": "n"}, {}),
    "sent": ({"n": "n"}, {}),
    # divider: paragraphs separated by that rule (IFEval's "***") instead of blank lines
    "para": ({"n": "n"}, {"divider": ("rule", None)}),
    "bullet": ({"n": "n"}, {}),
    "numbered": ({"n": "n"}, {}),
    "contains": ({"words": "words"}, {}),
    "no_word": ({"words": "words"}, {}),
    "no_char": ({"chars": "text"}, {}),
    "no_digits": ({}, {}),
    "startswith": ({"phrase": "text"}, {}),
    "endswith": ({"phrase": "text"}, {}),
    "is_upper": ({}, {}),
    "is_lower": ({}, {}),
    "quoted": ({}, {}),
    "postscript": ({}, {"marker": ("text", "P.S.")}),
    "placeholders": ({"n": "n"}, {}),
    "highlights": ({"n": "n"}, {}),
    "json_keys": ({"keys": "words"}, {}),
    "json_array_len": ({"n": "n"}, {}),
    "table_rows": ({"n": "n"}, {}),
}
FAMILIES = tuple(_SPECS)


def _name(c) -> str:
    return json.dumps(c, sort_keys=True, ensure_ascii=False) if isinstance(c, dict) else repr(c)


def validate(constraint) -> dict:
    """Return a normalised copy (optional params filled, single words listed); raise ValueError
    naming the constraint when its type is unknown or a param is missing, extra or malformed."""
    if not isinstance(constraint, dict) or "type" not in constraint:
        raise ValueError(f"constraint {_name(constraint)}: expected a dict with a 'type'")
    family = constraint["type"]
    if family not in _SPECS:
        raise ValueError(
            f"constraint {_name(constraint)}: unknown type {family!r}; known: {', '.join(FAMILIES)}"
        )
    required, optional = _SPECS[family]
    extra = set(constraint) - {"type"} - set(required) - set(optional)
    if extra:
        raise ValueError(
            f"constraint {_name(constraint)}: unexpected param(s) {sorted(extra)} for {family}"
        )
    out = {"type": family, **{k: d for k, (_, d) in optional.items() if d is not None}}
    for key, kind in required.items():
        if key not in constraint:
            raise ValueError(f"constraint {_name(constraint)}: missing param {key!r} for {family}")
        out[key] = _param(constraint, key, kind, constraint[key])
    for key, (kind, _) in optional.items():
        if key in constraint:
            out[key] = _param(constraint, key, kind, constraint[key])
    return out


def _param(constraint, key: str, kind: str, v):
    bad = ValueError(
        f"constraint {_name(constraint)}: param {key!r} must be "
        + {
            "n": "a non-negative integer",
            "text": "a non-empty string",
            "words": "a non-empty string or list of non-empty strings",
            "rule": "a markdown horizontal rule such as '***'",
        }[kind]
    )
    if kind == "n":
        # bool is an int subclass; True as a count is a bug in whatever wrote the constraint
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise bad
        return v
    if kind == "words" and isinstance(v, list):
        if not v or not all(isinstance(w, str) and w.strip() for w in v):
            raise bad
        return list(v)
    if not isinstance(v, str) or not v.strip():
        raise bad
    if kind == "rule" and not re.fullmatch(r"([-*_])(?:[ \t]*\1){2,}", v.strip()):
        raise bad
    return [v] if kind == "words" else v


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _quoted_list(words: list[str], conj: str) -> str:
    q = [f'"{w}"' for w in words]
    return q[0] if len(q) == 1 else f"{', '.join(q[:-1])} {conj} {q[-1]}"


# The instruction sentences: families that only count something ({n}: "3 words"), families with
# a fixed sentence, and families that quote one of their fields.
_COUNTED_SENTENCES = {
    "word_eq": ("Your answer must be exactly {n} long.", "word"),
    "word_min": ("Answer with at least {n}.", "word"),
    "word_max": ("Answer with at most {n}.", "word"),
    "sent": ("Answer in exactly {n}.", "sentence"),
    "para": ("Write exactly {n}, separated by blank lines.", "paragraph"),
    "bullet": ('Include exactly {n}, each on its own line starting with "* ".', "bullet point"),
    "numbered": ('Include a numbered list of exactly {n}, numbered "1.", "2.", and so on.', "item"),
    "placeholders": ("Include at least {n} in square brackets, such as [name].", "placeholder"),
    "highlights": ("Highlight at least {n} with markdown, i.e. *highlighted section*.", "section"),
    "json_array_len": ("Answer with a JSON array of exactly {n}, and nothing outside it.", "item"),
    "table_rows": ("Include a markdown table with exactly {n} below its header row.", "row"),
}
_FIXED_SENTENCES = {
    "no_digits": "Do not use any digits; write every number out in words.",
    "is_upper": "Write your entire answer in capital letters.",
    "is_lower": "Write your entire answer in lowercase letters; no capital letters at all.",
    "quoted": "Wrap your entire answer in double quotation marks.",
}
_QUOTING_SENTENCES = {
    "startswith": 'Begin your answer with the exact words "{phrase}".',
    "endswith": 'End your answer with the exact phrase "{phrase}", with nothing after it.',
    "postscript": 'At the end, add a postscript on its own line starting with "{marker}".',
}
_CHAR_NAMES = {
    ",": "commas",
    ";": "semicolons",
    "!": "exclamation marks",
    "?": "question marks",
    ":": "colons",
    "-": "hyphens",
}


def describe(constraint: dict) -> str:
    """The instruction sentence a prompt carries for `constraint`."""
    c = validate(constraint)
    t, n = c["type"], c.get("n")
    if t == "para" and "divider" in c:
        paragraphs = _plural(n, "paragraph")
        return f"Write exactly {paragraphs}, separated by the markdown divider {c['divider']}."
    if t in _COUNTED_SENTENCES:
        sentence, unit = _COUNTED_SENTENCES[t]
        return sentence.format(n=_plural(n, unit))
    if t in _FIXED_SENTENCES:
        return _FIXED_SENTENCES[t]
    if t in _QUOTING_SENTENCES:
        return _QUOTING_SENTENCES[t].format(**c)
    if t == "word_times":
        return f'Use the word "{c["word"]}" exactly {_plural(n, "time")}.'
    if t in ("contains", "no_word"):
        word = "word" if len(c["words"]) == 1 else "words"
        if t == "contains":
            return f"Include the {word} {_quoted_list(c['words'], 'and')}."
        return f"Do not use the {word} {_quoted_list(c['words'], 'or')}."
    if t == "no_char":
        if c["chars"] in _CHAR_NAMES:
            return f"Do not use any {_CHAR_NAMES[c['chars']]}."
        return f"Do not use any of these characters: {_quoted_list(list(c['chars']), 'or')}."
    if t == "json_keys":
        keys = c["keys"]
        return (
            f"Answer with a single JSON object with the {'key' if len(keys) == 1 else 'keys'} "
            f"{_quoted_list(keys, 'and')}, and nothing outside it."
        )
    raise AssertionError(f"family {t!r} has a spec but no description")  # pragma: no cover
