"""arenaflow.instruct.check: every constraint family, hand-computed, plus IFEval's checkers as an
oracle."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from arenaflow.instruct import check as ifcheck
from arenaflow.instruct import constraints as ifconstraints


def one(text: str, **constraint) -> tuple[bool, str]:
    result = ifcheck.check(text, [constraint])
    (c,) = result["checks"]
    assert c["type"] == constraint["type"] and c["passed"] is result["passed"]
    return c["passed"], c["reason"]


# --- every family: a passing and a failing response, counted by hand -----------------------
# (response, constraint, passes, reason when it fails)
CASES = [
    # word_eq: len(text.split()); punctuation stays attached, so "world!" is one word
    ("Hello there, big world!", {"type": "word_eq", "n": 4}, True, ""),
    ("one two three", {"type": "word_eq", "n": 40}, False, "word_eq: 3 words, expected 40"),
    ("one", {"type": "word_eq", "n": 2}, False, "word_eq: 1 word, expected 2"),
    ("", {"type": "word_eq", "n": 0}, True, ""),
    # word_min / word_max are inclusive
    ("a b c d e", {"type": "word_min", "n": 5}, True, ""),
    ("a b c d", {"type": "word_min", "n": 5}, False, "word_min: 4 words, expected at least 5"),
    ("a b c d e", {"type": "word_max", "n": 5}, True, ""),
    ("a b c d e f", {"type": "word_max", "n": 5}, False, "word_max: 6 words, expected at most 5"),
    # word_times: case-insensitive whole words; "rivers" and "riverbank" are not "river"
    (
        "River, river! The RIVER flows; rivers and a riverbank.",
        {"type": "word_times", "word": "river", "n": 3},
        True,
        "",
    ),
    (
        "The river is wide.",
        {"type": "word_times", "word": "river", "n": 2},
        False,
        "word_times: 'river' appears 1 time, expected 2",
    ),
    (
        "No rivers here.",
        {"type": "word_times", "word": "river", "n": 1},
        False,
        "word_times: 'river' appears 0 times, expected 1",
    ),
    (
        "Ice cream, then ice  cream again.",
        {"type": "word_times", "word": "ice cream", "n": 2},
        True,
        "",
    ),
    # sent: runs of . ! ? before whitespace or the end; 3.5 is no sentence end; ?! is one end
    ("It rained. Did it?! Yes... It cost 3.5 dollars.", {"type": "sent", "n": 4}, True, ""),
    ('He said "stop." Then left.', {"type": "sent", "n": 2}, True, ""),
    ("One. Two. Three", {"type": "sent", "n": 2}, False, "sent: 3 sentences, expected 2"),
    ("Just one.", {"type": "sent", "n": 2}, False, "sent: 1 sentence, expected 2"),
    # blind-review cases: titles, Latin abbreviations, initials, dotted abbreviations before a
    # lowercase word and list markers do not end a sentence; decimals never did
    ("Dr. Smith met Mr. Jones, e.g. at work.", {"type": "sent", "n": 1}, True, ""),
    ("The U.S. economy grew 3.5 percent. Prof. Lee agreed.", {"type": "sent", "n": 2}, True, ""),
    ("J. R. R. Tolkien wrote it at 9 a.m. sharp.", {"type": "sent", "n": 1}, True, ""),
    ("Steps:\n1. Mix the flour.\n2. Bake it.\n  10. Eat.", {"type": "sent", "n": 3}, True, ""),
    # ... but a dotted abbreviation before a capitalised word or a line break does
    ("They moved to the U.S. Then they left, etc.\nThe end.", {"type": "sent", "n": 3}, True, ""),
    # markdown emphasis closes like a quote: "**Bold.** Next" is two
    ("**Bold claim.** Next one.", {"type": "sent", "n": 2}, True, ""),
    ("See Dr. Who. Then go.", {"type": "sent", "n": 3}, False, "sent: 2 sentences, expected 3"),
    # para: blank lines (whitespace-only lines too) separate paragraphs
    ("First para.\n\nSecond para.\n \n\nThird.", {"type": "para", "n": 3}, True, ""),
    ("First.\r\n\r\nSecond.\r\n\r\n---\r\n\r\nThird.", {"type": "para", "n": 3}, True, ""),
    (
        "Line one.\nLine two of the same paragraph.",
        {"type": "para", "n": 2},
        False,
        "para: 1 paragraph, expected 2",
    ),
    # bullet: lines starting "* " or "- " (indent allowed); **bold**, ---, -5 are not bullets
    (
        "Intro:\n* one\n- two\n  * three\n**bold** line\n---\n-5 degrees",
        {"type": "bullet", "n": 3},
        True,
        "",
    ),
    ("* one\n* two", {"type": "bullet", "n": 3}, False, "bullet: 2 bullets, expected 3"),
    # numbered: lines starting "N. "
    (
        "Steps:\n1. mix\n2. bake\n10. eat\n3.5 is not an item",
        {"type": "numbered", "n": 3},
        True,
        "",
    ),
    ("1. only", {"type": "numbered", "n": 2}, False, "numbered: 1 numbered item, expected 2"),
    # contains: every word or phrase, case-insensitively, as whole words
    (
        "The Bridge spans the old river.",
        {"type": "contains", "words": ["bridge", "old river"]},
        True,
        "",
    ),
    (
        "Bridges everywhere.",
        {"type": "contains", "words": ["bridge", "river"]},
        False,
        'contains: missing "bridge" and "river"',
    ),
    ("A bridge.", {"type": "contains", "words": "bridge"}, True, ""),
    # no_word
    ("Quite fine stuffing.", {"type": "no_word", "words": ["very", "stuff"]}, True, ""),
    (
        "Very very good stuff.",
        {"type": "no_word", "words": ["very", "stuff", "nice"]},
        False,
        "no_word: found 'very' x2, 'stuff' x1",
    ),
    # no_char / no_digits
    ("No commas here; none at all.", {"type": "no_char", "chars": ","}, True, ""),
    (
        "One, two, three.",
        {"type": "no_char", "chars": ","},
        False,
        "no_char: 2 forbidden characters (',')",
    ),
    (
        "Wait; what!",
        {"type": "no_char", "chars": ";!"},
        False,
        "no_char: 2 forbidden characters ('!;')",
    ),
    ("Twenty two apples.", {"type": "no_digits"}, True, ""),
    ("22 apples and 1 pear.", {"type": "no_digits"}, False, "no_digits: 3 digits ('12')"),
    # startswith / endswith: whitespace-stripped response, case-sensitive
    ("  In short, yes.", {"type": "startswith", "phrase": "In short,"}, True, ""),
    (
        "in short, yes.",
        {"type": "startswith", "phrase": "In short,"},
        False,
        "startswith: begins with 'in short,', expected 'In short,'",
    ),
    ("All done. That is all.\n", {"type": "endswith", "phrase": "That is all."}, True, ""),
    (
        "That is all. Bye.",
        {"type": "endswith", "phrase": "That is all."},
        False,
        "endswith: ends with 'is all. Bye.', expected 'That is all.'",
    ),
    # is_upper / is_lower: str.isupper / str.islower (digits and punctuation do not count)
    ("HELLO, WORLD 42!", {"type": "is_upper"}, True, ""),
    ("HELLO, World", {"type": "is_upper"}, False, "is_upper: 4 lowercase letters"),
    ("1234", {"type": "is_upper"}, False, "is_upper: 0 lowercase letters and no cased letter"),
    ("hello, world 42!", {"type": "is_lower"}, True, ""),
    ("Hello World", {"type": "is_lower"}, False, "is_lower: 2 uppercase letters"),
    # quoted
    ('  "Wrapped answer."\n', {"type": "quoted"}, True, ""),
    (
        '"Half wrapped.',
        {"type": "quoted"},
        False,
        "quoted: starts with '\"' and ends with '.', expected '\"'",
    ),
    ('"', {"type": "quoted"}, False, "quoted: starts with '\"' and ends with '\"', expected '\"'"),
    # postscript: a line starting with the marker (default P.S.)
    ("Body text.\n\nP.S. See you soon.", {"type": "postscript"}, True, ""),
    (
        "Body text, P.S. inline does not count.",
        {"type": "postscript"},
        False,
        "postscript: no line starts with 'P.S.'",
    ),
    ("Body.\nP.P.S. more", {"type": "postscript", "marker": "P.P.S."}, True, ""),
    # a blind review's case: markdown around the marker still starts the line with it
    ("Body text.\n\n**P.S.** See you soon.", {"type": "postscript"}, True, ""),
    ("Body text.\n\n*P.S. See you soon.*", {"type": "postscript"}, True, ""),
    ("Body text.\n\n> P.S. See you soon.", {"type": "postscript"}, True, ""),
    ("Body text.\n> __P.S.__ nested", {"type": "postscript"}, True, ""),
    (
        "Body text with **P.S.** inline.",
        {"type": "postscript"},
        False,
        "postscript: no line starts with 'P.S.'",
    ),
    # placeholders: [non-blank] on one line, at least n
    (
        "Dear [name], your order [order id] ships to [address].",
        {"type": "placeholders", "n": 3},
        True,
        "",
    ),
    (
        "Dear [name], [] and [ ] are empty.",
        {"type": "placeholders", "n": 2},
        False,
        "placeholders: 1 placeholder, expected at least 2",
    ),
    # highlights: *x* and **x** with non-blank text, at least n
    ("This is *key* and **also key** but ** ** is not.", {"type": "highlights", "n": 2}, True, ""),
    (
        "Only *one* here.",
        {"type": "highlights", "n": 2},
        False,
        "highlights: 1 highlighted section, expected at least 2",
    ),
    # json_keys: a JSON object (optionally in a ``` fence) with every key
    (
        '{"title": "T", "year": 1999, "extra": null}',
        {"type": "json_keys", "keys": ["title", "year"]},
        True,
        "",
    ),
    (
        '```json\n{"title": "T", "year": 1999}\n```',
        {"type": "json_keys", "keys": ["title", "year"]},
        True,
        "",
    ),
    (
        '{"title": "T"}',
        {"type": "json_keys", "keys": ["title", "year", "author"]},
        False,
        'json_keys: missing keys "year" and "author"',
    ),
    (
        '["title"]',
        {"type": "json_keys", "keys": ["title"]},
        False,
        "json_keys: top level is an array, expected an object",
    ),
    (
        'Here you go: {"title": "T"}',
        {"type": "json_keys", "keys": ["title"]},
        False,
        "json_keys: not valid JSON (Expecting value at line 1 column 1)",
    ),
    # a blind review's cases: the closing fence on the JSON's line, a one-line fence, CRLF line ends
    (
        '```json\n{"title": "T",\n "year": 1}```',
        {"type": "json_keys", "keys": ["title", "year"]},
        True,
        "",
    ),
    ('```json {"title": "T"} ```', {"type": "json_keys", "keys": ["title"]}, True, ""),
    ('```{"title": "T"}```', {"type": "json_keys", "keys": ["title"]}, True, ""),
    (
        '```json\r\n{\r\n  "title": "T"\r\n}\r\n```\r\n',
        {"type": "json_keys", "keys": ["title"]},
        True,
        "",
    ),
    # an unclosed fence is not wrapped JSON (a truncated answer), nor is another language's fence
    (
        '```json\n{"title": "T"}',
        {"type": "json_keys", "keys": ["title"]},
        False,
        "json_keys: not valid JSON (Expecting value at line 1 column 1)",
    ),
    (
        '```python\n{"title": "T"}\n```',
        {"type": "json_keys", "keys": ["title"]},
        False,
        "json_keys: not valid JSON (Expecting value at line 1 column 1)",
    ),
    # json_array_len
    ("[1, 2, 3]", {"type": "json_array_len", "n": 3}, True, ""),
    ("```json\n[1, 2]```", {"type": "json_array_len", "n": 2}, True, ""),
    ("```json [1, 2, 3]```", {"type": "json_array_len", "n": 3}, True, ""),
    ("```json\r\n[1, 2, 3]\r\n```", {"type": "json_array_len", "n": 3}, True, ""),
    (
        '["a", "b"]',
        {"type": "json_array_len", "n": 3},
        False,
        "json_array_len: 2 items, expected 3",
    ),
    (
        '{"a": 1}',
        {"type": "json_array_len", "n": 1},
        False,
        "json_array_len: top level is an object, expected an array",
    ),
    # the reasons of the real-text shapes (more of them in tests/data/if_verdicts.jsonl)
    (
        "Hi.\n\nP.S. Bring snacks.\n\nBest,\nTom",
        {"type": "postscript"},
        False,
        "postscript: text after the 'P.S.' postscript ('Best,\\nTom')",
    ),
    (
        '{"x": NaN}',
        {"type": "json_keys", "keys": ["x"]},
        False,
        "json_keys: not valid JSON (NaN is not a JSON value)",
    ),
    ("A.\n* * *\nB.\n****\nC.", {"type": "para", "n": 3, "divider": "***"}, True, ""),
    # ```json {..}``` on one line is inline code, not a fence that swallows what follows
    ('```json {"a": 1}```\n\n* x\n* y', {"type": "bullet", "n": 2}, True, ""),
    (
        "A.\n\n---\n\nB.",
        {"type": "para", "n": 3},
        False,
        "para: 2 paragraphs, expected 3",
    ),
    # table_rows: body rows after the |---| separator, over every table
    (
        "Table:\n| a | b |\n|---|:--:|\n| 1 | 2 |\n| 3 | 4 |\n\nDone.",
        {"type": "table_rows", "n": 2},
        True,
        "",
    ),
    (
        "| a |\n|---|\n| 1 |\n\n| b |\n| --- |\n| 2 |\n| 3 |",
        {"type": "table_rows", "n": 3},
        True,
        "",
    ),
    (
        "| a | b |\n|---|---|\n| 1 | 2 |",
        {"type": "table_rows", "n": 2},
        False,
        "table_rows: 1 body row, expected 2",
    ),
    (
        "| a | b |\n| 1 | 2 |",
        {"type": "table_rows", "n": 1},
        False,
        "table_rows: no markdown table (a |-row followed by a |---| separator)",
    ),
]


@pytest.mark.parametrize(
    "text, constraint, passes, reason",
    CASES,
    ids=[f"{c[1]['type']}-{'pass' if c[2] else 'fail'}-{i}" for i, c in enumerate(CASES)],
)
def test_family(text, constraint, passes, reason):
    assert one(text, **constraint) == (passes, reason)


def test_every_family_has_a_passing_and_a_failing_case():
    seen = {(c[1]["type"], c[2]) for c in CASES}
    assert {f for f, _ in seen} == set(ifconstraints.FAMILIES)
    assert all((f, True) in seen and (f, False) in seen for f in ifconstraints.FAMILIES)


def test_multi_constraint_prompt_passes_only_if_every_check_passes():
    text = "* ALPHA\n* BETA"
    both = [{"type": "bullet", "n": 2}, {"type": "is_upper"}]
    assert ifcheck.check(text, both) == {
        "passed": True,
        "checks": [
            {"type": "bullet", "passed": True, "reason": ""},
            {"type": "is_upper", "passed": True, "reason": ""},
        ],
    }
    r = ifcheck.check(text, [*both, {"type": "word_eq", "n": 5}])
    assert r["passed"] is False
    assert [c["passed"] for c in r["checks"]] == [True, True, False]
    assert r["checks"][2]["reason"] == "word_eq: 4 words, expected 5"


@pytest.mark.parametrize(
    "constraint, message",
    [
        ({"type": "word_count"}, r"unknown type 'word_count'"),
        ({"type": "word_eq"}, r"missing param 'n' for word_eq"),
        ({"type": "word_eq", "n": "40"}, r"param 'n' must be a non-negative integer"),
        ({"type": "word_eq", "n": -1}, r"param 'n' must be a non-negative integer"),
        ({"type": "word_eq", "n": True}, r"param 'n' must be a non-negative integer"),
        ({"type": "word_eq", "n": 4, "N": 4}, r"unexpected param\(s\) \['N'\]"),
        ({"type": "contains", "words": []}, r"param 'words' must be"),
        ({"type": "contains", "words": ["ok", ""]}, r"param 'words' must be"),
        ({"type": "no_char", "chars": ""}, r"param 'chars' must be a non-empty string"),
        ({"type": "json_keys"}, r"missing param 'keys'"),
        ({"type": "para", "n": 2, "divider": "==="}, r"param 'divider' must be a markdown"),
        ({"n": 3}, r"expected a dict with a 'type'"),
        ("word_eq", r"expected a dict with a 'type'"),
    ],
)
def test_unknown_or_malformed_constraint_raises_naming_it(constraint, message):
    with pytest.raises(ValueError, match=message) as e:
        ifcheck.check("text", [constraint])
    if isinstance(constraint, dict):
        assert json.dumps(constraint, sort_keys=True) in str(e.value)
    with pytest.raises(ValueError, match=message):
        ifconstraints.describe(constraint)


def test_constraints_must_be_a_non_empty_list():
    with pytest.raises(ValueError, match="non-empty list"):
        ifcheck.check("x", [])
    with pytest.raises(ValueError, match="non-empty list"):
        ifcheck.check("x", {"type": "quoted"})


def test_validate_fills_optional_params_and_lists_single_words():
    assert ifconstraints.validate({"type": "postscript"}) == {
        "type": "postscript",
        "marker": "P.S.",
    }
    assert ifconstraints.validate({"type": "no_word", "words": "very"}) == {
        "type": "no_word",
        "words": ["very"],
    }


# --- describe ---------------------------------------------------------------------------------

DESCRIBE = {
    "word_eq": ({"n": 40}, "Your answer must be exactly 40 words long."),
    "word_min": ({"n": 1}, "Answer with at least 1 word."),
    "word_max": ({"n": 80}, "Answer with at most 80 words."),
    "word_times": ({"word": "light", "n": 3}, 'Use the word "light" exactly 3 times.'),
    "sent": ({"n": 1}, "Answer in exactly 1 sentence."),
    "para": ({"n": 3}, "Write exactly 3 paragraphs, separated by blank lines."),
    "bullet": (
        {"n": 4},
        'Include exactly 4 bullet points, each on its own line starting with "* ".',
    ),
    "numbered": (
        {"n": 5},
        'Include a numbered list of exactly 5 items, numbered "1.", "2.", and so on.',
    ),
    "contains": ({"words": ["energy", "pattern"]}, 'Include the words "energy" and "pattern".'),
    "no_word": (
        {"words": ["very", "really", "just"]},
        'Do not use the words "very", "really" or "just".',
    ),
    "no_char": ({"chars": ","}, "Do not use any commas."),
    "no_digits": ({}, "Do not use any digits; write every number out in words."),
    "startswith": ({"phrase": "In short,"}, 'Begin your answer with the exact words "In short,".'),
    "endswith": (
        {"phrase": "The end."},
        'End your answer with the exact phrase "The end.", with nothing after it.',
    ),
    "is_upper": ({}, "Write your entire answer in capital letters."),
    "is_lower": ({}, "Write your entire answer in lowercase letters; no capital letters at all."),
    "quoted": ({}, "Wrap your entire answer in double quotation marks."),
    "postscript": ({}, 'At the end, add a postscript on its own line starting with "P.S.".'),
    "placeholders": (
        {"n": 2},
        "Include at least 2 placeholders in square brackets, such as [name].",
    ),
    "highlights": (
        {"n": 2},
        "Highlight at least 2 sections with markdown, i.e. *highlighted section*.",
    ),
    "json_keys": (
        {"keys": ["title", "year"]},
        'Answer with a single JSON object with the keys "title" and "year", '
        "and nothing outside it.",
    ),
    "json_array_len": (
        {"n": 4},
        "Answer with a JSON array of exactly 4 items, and nothing outside it.",
    ),
    "table_rows": ({"n": 3}, "Include a markdown table with exactly 3 rows below its header row."),
}


@pytest.mark.parametrize("family", ifconstraints.FAMILIES)
def test_describe_every_family(family):
    params, text = DESCRIBE[family]
    assert ifconstraints.describe({"type": family, **params}) == text


def test_describe_paragraphs_with_a_divider():
    assert (
        ifconstraints.describe({"type": "para", "n": 3, "divider": "***"})
        == "Write exactly 3 paragraphs, separated by the markdown divider ***."
    )
    assert ifconstraints.validate({"type": "para", "n": 3}) == {"type": "para", "n": 3}


def test_describe_other_forbidden_characters():
    assert (
        ifconstraints.describe({"type": "no_char", "chars": "#@"})
        == 'Do not use any of these characters: "#" or "@".'
    )


def test_cli_exit_status_is_the_verdict(capsys, monkeypatch):
    import io as stdio

    monkeypatch.setattr("sys.stdin", stdio.StringIO("one two three"))
    with pytest.raises(SystemExit) as e:
        ifcheck.main(["--constraints-json", '[{"type": "word_eq", "n": 4}]'])
    assert e.value.code == 1
    assert "word_eq: 3 words, expected 4" in capsys.readouterr().out


# --- IFEval's checkers (lm-eval) as an independent oracle ----------------------------------


@pytest.fixture(scope="module")
def ifeval():
    """lm_eval.tasks.ifeval.instructions, imported offline. Its instructions_util tries to
    download NLTK's punkt on import; none of the families checked here uses it (its sentence
    counter does, so `sent` is checked against its rule-based split_into_sentences instead),
    so the download is stubbed out."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("langdetect")
    pytest.importorskip("immutabledict")
    nltk = pytest.importorskip("nltk")
    real = nltk.download
    nltk.download = lambda *a, **k: False
    try:
        mod = pytest.importorskip("lm_eval.tasks.ifeval.instructions")
    finally:
        nltk.download = real
    from langdetect import DetectorFactory

    DetectorFactory.seed = 0  # langdetect is randomised; the uppercase/lowercase checkers use it
    return mod


WORDS = (
    "the",
    "garden",
    "grows",
    "slowly",
    "under",
    "a",
    "warm",
    "sky",
    "and",
    "every",
    "morning",
    "birds",
    "sing",
    "over",
    "quiet",
    "fields",
    "while",
    "children",
    "walk",
    "to",
    "school",
)


def _sentence(rng: random.Random, comma: bool = False) -> str:
    words = rng.sample(WORDS, rng.randint(4, 9))
    if comma:
        words[1] += ","
    return " ".join(words).capitalize() + "."


def _responses(rng: random.Random, k: int = 40):
    """Varied plain-English responses: paragraphs, optional bullets, commas and decorations."""
    for _ in range(k):
        paras = [
            " ".join(_sentence(rng, rng.random() < 0.2) for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(1, 4))
        ]
        yield "\n\n".join(paras)


def _agree(mine, theirs, texts):
    disagreements = [(t, m, o) for t in texts if (m := mine(t)) != (o := bool(theirs(t)))]
    assert not disagreements, disagreements[:3]
    # the generated cases must exercise both verdicts, or the agreement says nothing
    assert {bool(theirs(t)) for t in texts} == {True, False}


def _oracle(cls, **kwargs):
    inst = cls("oracle")
    inst.build_description(**kwargs)
    return inst.check_following


def test_oracle_no_comma(ifeval):
    texts = list(_responses(random.Random(1)))
    _agree(lambda t: one(t, type="no_char", chars=",")[0], _oracle(ifeval.CommaChecker), texts)


@pytest.mark.parametrize("n", [1, 3, 5])
def test_oracle_bullets(ifeval, n):
    rng = random.Random(n)
    texts = []
    for text in _responses(rng, 30):
        bullets = [
            f"{rng.choice('*-')} {_sentence(rng)}" for _ in range(rng.randint(max(0, n - 2), n + 2))
        ]
        texts.append(text + "\n\n" + "\n".join(bullets) + "\n\n" + _sentence(rng))
    _agree(
        lambda t: one(t, type="bullet", n=n)[0],
        _oracle(ifeval.BulletListChecker, num_bullets=n),
        texts,
    )


ENGLISH = (
    "The weather was cold this morning, so we stayed inside and read books.",
    "My brother likes to cook pasta for the whole family on Sundays.",
    "There is a small library near the station where I study after work.",
    "We walked along the river and watched the boats go by.",
    "Please remember to close the window before you leave the house.",
    "The children were very happy when the school holidays began.",
    "I think this is the best coffee I have had in a long time.",
    "She wrote a letter to her friend who lives in another country.",
)


@pytest.mark.parametrize(
    "family, cls",
    [("is_upper", "CapitalLettersEnglishChecker"), ("is_lower", "LowercaseLettersEnglishChecker")],
)
def test_oracle_letter_case(ifeval, family, cls):
    from langdetect import detect

    rng = random.Random(7)
    texts = []
    for _ in range(40):
        text = " ".join(rng.sample(ENGLISH, rng.randint(1, 3)))
        # IFEval also asks langdetect for English; compare only the case rule, on texts it
        # reads as English in every casing (it misreads some all-caps English)
        if {detect(text), detect(text.upper()), detect(text.lower())} != {"en"}:
            continue
        r = rng.random()
        texts.append(text.upper() if r < 0.35 else text.lower() if r < 0.7 else text)
    assert len(texts) >= 20
    _agree(lambda t: one(t, type=family)[0], _oracle(getattr(ifeval, cls)), texts)


POSTSCRIPTS = ("P.S. {}", "**P.S.** {}", "*P.S. {}*", "> P.S. {}", "> **P.S.** {}", "__P.S.__ {}")


def test_oracle_postscript(ifeval):
    # the blind review's markdown forms too: IFEval finds the marker anywhere in a line, so on a
    # line of its own it agrees with ours
    rng = random.Random(3)
    texts = [
        t + ("\n\n" + rng.choice(POSTSCRIPTS).format(_sentence(rng)) if rng.random() < 0.5 else "")
        for t in _responses(rng, 60)
    ]
    _agree(
        lambda t: one(t, type="postscript")[0],
        _oracle(ifeval.PostscriptChecker, postscript_marker="P.S."),
        texts,
    )


@pytest.mark.parametrize("n", [1, 2, 4])
def test_oracle_placeholders(ifeval, n):
    rng = random.Random(n)
    texts = []
    for text in _responses(rng, 30):
        words = text.split(" ")
        for _ in range(rng.randint(0, n + 1)):
            i = rng.randrange(len(words))
            words[i] = f"[{words[i].strip('.,')}]"
        texts.append(" ".join(words))
    _agree(
        lambda t: one(t, type="placeholders", n=n)[0],
        _oracle(ifeval.PlaceholderChecker, num_placeholders=n),
        texts,
    )


@pytest.mark.parametrize("n", [1, 2, 3])
def test_oracle_highlights(ifeval, n):
    rng = random.Random(n)
    texts = []
    for text in _responses(rng, 30):
        words = text.split(" ")
        for _ in range(rng.randint(0, n + 1)):
            i = rng.randrange(len(words))
            mark = rng.choice(["*", "**"])
            words[i] = f"{mark}{words[i].strip('.,')}{mark}"
        texts.append(" ".join(words))
    _agree(
        lambda t: one(t, type="highlights", n=n)[0],
        _oracle(ifeval.HighlightSectionChecker, num_highlights=n),
        texts,
    )


def test_oracle_json(ifeval):
    rng = random.Random(5)
    texts = []
    for i in range(80):
        obj = {
            "title": _sentence(rng),
            "year": rng.randint(1900, 2030),
            "tags": rng.sample(WORDS, 3),
        }
        text = json.dumps(obj, indent=rng.choice([None, 2]))
        if i % 3 == 0:  # the blind review's fence shapes: closing backticks on the JSON's line,
            # one-line fences, CRLF line ends
            text = rng.choice(
                [
                    "```json\n{}\n```",
                    "```json\n{}```",
                    "```json {} ```",
                    "```{}```",
                    "```JSON\r\n{}\r\n```\r\n",
                ]
            ).format(text.replace("\n", "\r\n"))
        if i % 4 == 1:
            text = text[: rng.randint(1, len(text) - 2)]  # truncated: not JSON
        texts.append(text)
    _agree(lambda t: one(t, type="json_keys", keys=["title"])[0], _oracle(ifeval.JsonFormat), texts)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_oracle_paragraphs(ifeval, n):
    # IFEval's paragraph-count-and-first-word check, with the first word our responses start with
    rng = random.Random(n)
    texts = []
    for _ in range(30):
        paras = ["Alpha " + _sentence(rng)] + [_sentence(rng) for _ in range(rng.randint(0, n + 1))]
        texts.append(rng.choice(["\n\n", "\n\n\n\n"]).join(paras))
    _agree(
        lambda t: one(t, type="para", n=n)[0],
        _oracle(
            ifeval.ParagraphFirstWordCheck, num_paragraphs=n, nth_paragraph=1, first_word="alpha"
        ),
        texts,
    )


@pytest.mark.parametrize("n", [20, 35])
def test_oracle_word_min_max(ifeval, n):
    # IFEval counts \w+ runs; on words without apostrophes, hyphens or digits that is split()
    texts = list(_responses(random.Random(n)))
    _agree(
        lambda t: one(t, type="word_min", n=n)[0],
        _oracle(ifeval.NumberOfWords, num_words=n, relation="at least"),
        texts,
    )
    _agree(
        lambda t: one(t, type="word_max", n=n)[0],
        _oracle(ifeval.NumberOfWords, num_words=n + 1, relation="less than"),
        texts,
    )


@pytest.mark.parametrize("word, n", [("garden", 1), ("birds", 2)])
def test_oracle_word_times(ifeval, word, n):
    # IFEval has "at least" and "less than"; exactly n = at least n and less than n + 1. Its
    # match is a substring one; none of WORDS contains another, so here the two coincide.
    rng = random.Random(n)
    texts = [" ".join(_sentence(rng) for _ in range(rng.randint(1, 5))) for _ in range(60)]
    at_least = _oracle(
        ifeval.KeywordFrequencyChecker, keyword=word, frequency=n, relation="at least"
    )
    under = _oracle(
        ifeval.KeywordFrequencyChecker, keyword=word, frequency=n + 1, relation="less than"
    )
    _agree(
        lambda t: one(t, type="word_times", word=word, n=n)[0],
        lambda t: at_least(t) and under(t),
        texts,
    )


def test_oracle_contains_and_no_word(ifeval):
    texts = list(_responses(random.Random(11), 60))
    words = ["garden", "quiet"]
    _agree(
        lambda t: one(t, type="contains", words=words)[0],
        _oracle(ifeval.KeywordChecker, keywords=words),
        texts,
    )
    _agree(
        lambda t: one(t, type="no_word", words=words)[0],
        _oracle(ifeval.ForbiddenWords, forbidden_words=words),
        texts,
    )


def test_oracle_quoted_and_endswith(ifeval):
    rng = random.Random(13)
    texts = []
    for text in _responses(rng, 40):
        r = rng.random()
        texts.append(f'"{text}"' if r < 0.3 else f"{text} That is all." if r < 0.6 else text)
    _agree(lambda t: one(t, type="quoted")[0], _oracle(ifeval.QuotationChecker), texts)
    plain = [t for t in texts if not t.startswith('"')]  # IFEval strips quotes before comparing
    _agree(
        lambda t: one(t, type="endswith", phrase="That is all.")[0],
        _oracle(ifeval.EndChecker, end_phrase="That is all."),
        plain,
    )


# sentences both splitters count alike: titles, initials, e.g./i.e., a.m., U.S. before a
# lowercase word or before one of IFEval's "starters" (He, It, ...), decimals, ?, ! and "..."
SENTENCES = (
    "Dr. Smith reads every morning.",
    "We saw birds, e.g. crows and owls.",
    "The U.S. economy grows slowly.",
    "It costs 3.5 dollars.",
    "J. R. R. Tolkien wrote many books.",
    "The meeting starts at 9 a.m. sharp.",
    "Mrs. Jones met Mr. Brown at the station.",
    "They moved to the U.S. He liked it there.",
    "Did it rain?",
    "What a day!",
    "Wait... it rained again.",
    "We bought apples, i.e. the red ones.",
)


def test_oracle_sentences(ifeval):
    from lm_eval.tasks.ifeval import instructions_util

    rng = random.Random(17)
    texts = [
        rng.choice([" ", "\n", "\n\n"]).join(rng.sample(SENTENCES, rng.randint(1, 5)))
        for _ in range(80)
    ]
    mine = [ifcheck.count_sentences(t) for t in texts]
    theirs = [len(instructions_util.split_into_sentences(t)) for t in texts]
    assert [(t, m, o) for t, m, o in zip(texts, mine, theirs) if m != o] == []
    assert len(set(theirs)) >= 4
    # and a `sent` check is that count
    assert all(one(t, type="sent", n=m)[0] for t, m in zip(texts, mine))


def test_ifeval_sentence_splitter_is_wrong_on_these_shapes(ifeval):
    """IFEval's rule-based splitter ends a sentence at a list marker and after "Prof.", and does
    not after "U.S." before a capitalised word other than its few starters; arenaflow's counts
    are the intended ones."""
    from lm_eval.tasks.ifeval import instructions_util

    for text, want in [
        ("Steps:\n1. Mix the flour.\n2. Bake it.", 2),
        ("Prof. Lee came.", 1),
        ("They moved to the U.S. Then they left.", 2),
    ]:
        assert len(instructions_util.split_into_sentences(text)) != want
        assert ifcheck.count_sentences(text) == want


def test_documented_divergences_from_ifeval(ifeval):
    """Where lineage 003's definitions, which ifcheck follows
    (docs/lineages.md#003-failure-analysis-by-checker-reason), differ from IFEval's on purpose;
    pinned so neither drifts."""
    # IFEval finds "p.s." anywhere in a line; ours wants a line that starts with it
    inline = "All good, p.s. inline."
    assert _oracle(ifeval.PostscriptChecker, postscript_marker="P.S.")(inline)
    assert not one(inline, type="postscript")[0]
    # IFEval's keyword count is a substring count; ours is whole words
    assert _oracle(
        ifeval.KeywordFrequencyChecker, keyword="river", frequency=2, relation="at least"
    )("rivers river")
    assert not one("rivers river", type="word_times", word="river", n=2)[0]
    # IFEval's end phrase is case-insensitive; ours is exact
    assert _oracle(ifeval.EndChecker, end_phrase="The end.")("THE END.")
    assert not one("THE END.", type="endswith", phrase="The end.")[0]
    # IFEval strips an opening and a closing fence independently, so an unclosed fence (a
    # truncated answer) passes; ours wants the JSON wrapped, both fences or none
    assert _oracle(ifeval.JsonFormat)('```json\n{"title": "T"}')
    assert not one('```json\n{"title": "T"}', type="json_keys", keys=["title"])[0]
    # IFEval counts \w+ runs as words ("don't" is 2); ours counts whitespace tokens
    assert not _oracle(ifeval.NumberOfWords, num_words=3, relation="less than")("don't stop")
    assert one("don't stop", type="word_max", n=2)[0]


def test_generated_responses_include_both_verdicts_for_reasons():
    # sanity of the helpers above: reasons are non-empty exactly when a check fails
    for text in _responses(random.Random(0), 10):
        r = ifcheck.check(text, [{"type": "word_min", "n": 15}, {"type": "no_char", "chars": ","}])
        for c in r["checks"]:
            assert (c["reason"] == "") == c["passed"]
            assert c["passed"] or re.match(rf"^{c['type']}: ", c["reason"])


# --- hand-labelled verdicts on real-text shapes (tests/data/if_verdicts.jsonl) ----------------
# Each row: text, constraint, a careful human's label and the reason. The held-out split was
# written and committed before the checker was changed for these shapes; the dev split guided
# the changes. IFEval's checker for the same constraint (None where IFEval has none) is scored on
# the same labels.

VERDICTS = Path(__file__).parents[1] / "data" / "if_verdicts.jsonl"


def _verdict_rows() -> list[dict]:
    return [json.loads(line) for line in VERDICTS.read_text(encoding="utf-8").splitlines()]


def _ifeval_json(text: str):
    """IFEval's JsonFormat parse (fences stripped its way), or a sentinel when it fails."""
    value = text.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        value = value.removeprefix(fence)
    try:
        return json.loads(value.removesuffix("```").strip())
    except ValueError:
        return _INVALID


_INVALID = object()


def _ifeval_verdict(ifeval, text: str, c: dict):
    """IFEval's verdict on `text` for arenaflow constraint `c`, or None where IFEval has no
    checker for that family (or that form of it)."""
    from lm_eval.tasks.ifeval import instructions_util

    t, n = c["type"], c.get("n")

    def between(cls, key, **kw):  # exactly n = at least n and less than n + 1
        return _oracle(cls, **{key: n}, relation="at least", **kw)(text) and _oracle(
            cls, **{key: n + 1}, relation="less than", **kw
        )(text)

    if t == "word_eq":
        return between(ifeval.NumberOfWords, "num_words")
    if t in ("word_min", "word_max"):
        rel, k = ("at least", n) if t == "word_min" else ("less than", n + 1)
        return _oracle(ifeval.NumberOfWords, num_words=k, relation=rel)(text)
    if t == "word_times":
        return between(ifeval.KeywordFrequencyChecker, "frequency", keyword=c["word"])
    if t == "sent":  # its punkt counter needs a download; its rule-based splitter does not
        return len(instructions_util.split_into_sentences(text)) == n
    if t == "para":
        if c.get("divider") != "***":
            return None
        return _oracle(ifeval.ParagraphChecker, num_paragraphs=n)(text)
    simple = {
        "bullet": lambda: _oracle(ifeval.BulletListChecker, num_bullets=n),
        "contains": lambda: _oracle(ifeval.KeywordChecker, keywords=c["words"]),
        "no_word": lambda: _oracle(ifeval.ForbiddenWords, forbidden_words=c["words"]),
        "endswith": lambda: _oracle(ifeval.EndChecker, end_phrase=c["phrase"]),
        "quoted": lambda: _oracle(ifeval.QuotationChecker),
        "postscript": lambda: _oracle(ifeval.PostscriptChecker, postscript_marker=c["marker"]),
        "placeholders": lambda: _oracle(ifeval.PlaceholderChecker, num_placeholders=n),
        "highlights": lambda: _oracle(ifeval.HighlightSectionChecker, num_highlights=n),
    }
    if t in simple:
        return simple[t]()(text)
    if t == "no_char" and c["chars"] == ",":
        return _oracle(ifeval.CommaChecker)(text)
    if t in ("json_keys", "json_array_len"):
        v = _ifeval_json(text)
        if t == "json_keys":
            return isinstance(v, dict) and all(k in v for k in c["keys"])
        return isinstance(v, list) and len(v) == n
    return None


def _scored(ifeval) -> list[dict]:
    rows = []
    for row in _verdict_rows():
        c = {"postscript": {"marker": "P.S."}}.get(row["constraint"]["type"], {})
        c = {**c, **row["constraint"]}
        ours = ifcheck.check(row["text"], [row["constraint"]])["passed"]
        theirs = _ifeval_verdict(ifeval, row["text"], c)
        rows.append({**row, "ours": ours, "ifeval": theirs})
    return rows


def _agreement(rows: list[dict], who: str) -> tuple[int, int]:
    judged = [r for r in rows if r[who] is not None]
    return sum(r[who] == r["label"] for r in judged), len(judged)


def test_verdict_data_is_well_formed():
    rows = _verdict_rows()
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["split"] in ("dev", "heldout") and isinstance(r["label"], bool), r["id"]
        assert r["note"].strip(), r["id"]
        ifconstraints.validate(r["constraint"])
    # every class has cases in both splits, and both labels occur
    for split in ("dev", "heldout"):
        classes = {r["class"] for r in rows if r["split"] == split}
        assert classes == {r["class"] for r in rows}, split
    assert {r["label"] for r in rows} == {True, False}


@pytest.mark.parametrize("split", ["dev", "heldout"])
def test_agreement_with_careful_grader(ifeval, split, capsys):
    rows = [r for r in _scored(ifeval) if r["split"] == split]
    ours, n = _agreement(rows, "ours")
    theirs, m = _agreement(rows, "ifeval")
    with capsys.disabled():
        print(f"\n{split}: arenaflow {ours}/{n}, IFEval {theirs}/{m} (where IFEval has a checker)")
    wrong = [(r["id"], r["note"]) for r in rows if r["ours"] != r["label"]]
    assert wrong == []
    # so arenaflow is right on every case where IFEval is right
    assert [r["id"] for r in rows if r["ifeval"] == r["label"] and r["ours"] != r["label"]] == []
