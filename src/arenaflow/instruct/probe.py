"""The anti-overfitting probe of instruction following: ifpool's third split, `probe`.

Lineage 002's probe2 (docs/lineages.md#002-sft-dpo-and-if-repair) was "deliberately built to be
unlike H6: edge-of-band constraint values, subjects and templates disjoint from both the training
pools and H6". Here, against ifpool's train and eval splits:

- subjects: PROBE_SUBJECTS, none of domains.SUBJECTS;
- task templates: PROBE_TASKS, none opening with a verb domains.TASKS opens with;
- constraint phrasings: `describe` below, a second sentence for every family sharing no run of
  four words with arenaflow.instruct.constraints.describe's (values aside);
- constraint values: PROBE_DOMAINS, outside the train and eval ranges (which together are the
  whole of domains.DOMAINS): counts just past either edge of each range ("edge of band": exactly
  5 or 155 words where train/eval span 10..150), and word, phrase and key lists of their own.
  Families whose checker has no parameter in train/eval carry one here where the checker allows
  it (no_char: ; ! ? instead of the comma; postscript: P.P.S. or N.B. instead of P.S.);
  no_digits, is_upper, is_lower and quoted differ by subject, task and phrasing only.

The probe is a fixed set: it does not depend on ifpool's hash partition, so adding it left every
train and eval draw byte-identical.
"""

from __future__ import annotations

PROBE_SUBJECTS = (
    "the history of the umbrella",
    "how hot-air balloons fly",
    "the care of antique clocks",
    "why cats purr",
    "the building of the Panama Canal",
    "how coral atolls form",
    "the craft of glassblowing",
    "the life of an ant colony",
    "how fireflies glow",
    "the invention of the zipper",
    "the story of the harmonica",
    "how hydroelectric dams work",
    "the migration of monarch butterflies",
    "the origins of the marathon",
    "keeping backyard chickens",
    "how a compass finds north",
    "the history of ice cream",
    "the Northern Lights",
    "how peat bogs preserve things",
    "the Trans-Siberian Railway",
    "how seeds travel",
    "the design of a violin",
    "the habits of sea otters",
    "the history of the typewriter",
    "how maple syrup is made",
    "the craft of bookbinding",
    "how a hovercraft moves",
    "the Mongol postal relay",
    "the sleep of dolphins",
    "how quicksand works",
)
PROBE_TASKS = (
    "Compose a piece on {s}.",
    "Introduce {s} to a reader who knows nothing about it.",
    "Share what you know about {s}.",
    "Prepare a brief newsletter item on {s}.",
    "Walk a classroom through {s}.",
)
_TIMES_WORDS = ("river", "stone", "voice", "window", "garden", "market", "winter", "memory")
_REQUIRED_WORDS = ("harmony", "curious", "gentle", "ripple", "horizon", "texture", "rhythm")
_FORBIDDEN_WORDS = ("also", "often", "quite", "kind", "lot", "everything", "truly", "totally")
_OPENERS = ("Here we go.", "Consider this.", "Straight to the point.", "A quick note first.")
_CLOSERS = ("Hope this helps.", "Over and out.", "End of answer.", "Enough said.")
_JSON_KEYS = ("name", "origin", "price", "color", "weight", "status", "owner", "priority")

# family -> {param: values}, every family of domains.DOMAINS (values outside its train/eval range)
PROBE_DOMAINS: dict[str, dict[str, tuple]] = {
    "word_eq": {"n": (5, 155, 160, 170)},
    "word_min": {"n": (30, 40, 425, 450)},
    "word_max": {"n": (10, 15, 220, 250)},
    "word_times": {"word": _TIMES_WORDS, "n": (1, 9, 10)},
    "sent": {"n": (13, 14, 15)},
    "para": {"n": (1, 8, 9)},
    "bullet": {"n": (1, 10, 11, 12)},
    "numbered": {"n": (1, 10, 11, 12)},
    "contains": {"words": _REQUIRED_WORDS},
    "no_word": {"words": _FORBIDDEN_WORDS},
    "no_char": {"chars": (";", "!", "?")},
    "no_digits": {},
    "startswith": {"phrase": _OPENERS},
    "endswith": {"phrase": _CLOSERS},
    "is_upper": {},
    "is_lower": {},
    "quoted": {},
    "postscript": {"marker": ("P.P.S.", "N.B.")},
    "placeholders": {"n": (7, 8, 9)},
    "highlights": {"n": (7, 8, 9)},
    "json_keys": {"keys": _JSON_KEYS},
    "json_array_len": {"n": (1, 11, 12, 15)},
    "table_rows": {"n": (1, 11, 12)},
}

# the probe's own instruction sentences ({n}: "3 words", {q}: a quoted list)
_COUNTED = {
    "word_eq": ("The response should contain precisely {n}.", "word"),
    "word_min": ("Make the response no shorter than {n}.", "word"),
    "word_max": ("Keep the response to no more than {n}.", "word"),
    "word_times": ('The word "{word}" should appear precisely {n}.', "time"),
    "sent": ("Use precisely {n} in total.", "sentence"),
    "para": (
        "Organise the text into precisely {n} with an empty line between consecutive ones.",
        "paragraph",
    ),
    "bullet": ('Present precisely {n}; start every one of them with "* " on a new line.', "bullet"),
    "numbered": ("Give precisely {n} as a list numbered 1. 2. 3. and onwards.", "entry"),
    "placeholders": (
        "Put no fewer than {n} inside square brackets, for example [address].",
        "placeholder",
    ),
    "highlights": (
        "Mark no fewer than {n} in markdown italics or bold, for example *like this*.",
        "passage",
    ),
    "json_array_len": (
        "Reply only with a JSON list holding precisely {n}; add nothing before or after it.",
        "element",
    ),
    "table_rows": ("Add a markdown table whose body has precisely {n} under the header.", "row"),
}
_OTHER = {
    "no_digits": "Spell out every number in letters, since numerals are not allowed.",
    "is_upper": "Use only uppercase letters throughout the response.",
    "is_lower": "Use only lowercase letters throughout the response, with no uppercase anywhere.",
    "quoted": "Put the whole response between a pair of double quotes.",
    "startswith": 'The response has to open with these exact words: "{phrase}"',
    "endswith": 'The final words of the response have to be "{phrase}", followed by nothing.',
    "postscript": 'Close with a postscript on a separate line that opens with "{marker}".',
    "contains": "Make sure the response mentions {q}.",
    "no_word": "Never write {q}.",
    "json_keys": "Reply only with one JSON object whose keys are {q}; add nothing before or after.",
}
_CHARS = {";": "semicolon", "!": "exclamation mark", "?": "question mark"}


def _count(n: int, unit: str) -> str:
    return f"{n} {unit}" + ("" if n == 1 else "s")


def _quote(words: list[str], conj: str) -> str:
    q = [f'"{w}"' for w in words]
    return q[0] if len(q) == 1 else f"{', '.join(q[:-1])} {conj} {q[-1]}"


def describe(c: dict) -> str:
    """The probe's instruction sentence for a validated constraint `c`."""
    t = c["type"]
    if t in _COUNTED:
        sentence, unit = _COUNTED[t]
        return sentence.format(n=_count(c["n"], unit), word=c.get("word"))
    if t == "no_char":
        return f"Not a single {_CHARS[c['chars']]} may appear in the response."
    if t in ("contains", "no_word"):
        q = _quote(c["words"], "and" if t == "contains" else "or")
        return _OTHER[t].format(q=q)
    if t == "json_keys":
        return _OTHER[t].format(q=_quote(c["keys"], "and"))
    return _OTHER[t].format(**c)


# multi-turn conversations (ifpool.conversations): the probe's own follow-up turns
PROBE_FOLLOW_UPS = (
    "Pick one detail from that and develop it.",
    "Say it all again as if to a ten-year-old.",
    "Turn that into advice someone could act on today.",
    "Tell me which part of that is most debated.",
    "Relate that to daily life in a big city.",
    "Close the topic with your own verdict.",
)
PROBE_KEEP = (
    "An extra rule applies starting with this reply: {c} The rules given before still apply."
)
