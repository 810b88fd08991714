"""Decontamination: drop every training row whose prompt, once normalised, is an evaluation item,
shares a 30-token run with one, or (short texts) is one with a few words added or removed; record
how many were dropped and which, with the eval item hit and the rule that matched.

    python -m arenaflow.corpora.decontam --train pools/math_r1.jsonl --eval pools/math_eval.jsonl
        --out pools/math_r1.clean.jsonl --record pools/math_r1.decontam.json

Normalisation (`tokens`): NFKC (fullwidth letters and digits, ligatures and odd spaces become
their plain forms), format characters removed (zero-width spaces and joiners, soft hyphens), the
minus sign and en dash read as '-', × and ÷ as '*' and '/', then casefolded. Tokens are runs of
letters, numbers (digits, with decimal points) and single symbols, so spacing does not matter:
"what is 3+4 ?" and "What is 3 + 4?" are the same tokens. Prose punctuation (PROSE: . , ; : ! ?
and quotes) is dropped; operators and brackets stay tokens, because "3 + 4" and "3 - 4" are
different problems. Leading labels are stripped, repeatedly: a word of PREFIXES ("Question:",
"Q.", "Problem 3:", "Prompt:", "Solve:", ...) and list numbering ("1.", "2)").

Rules, tried in this order, each against every eval item (the record names the one that matched):
- exact: the same normalised tokens.
- shingle: a run of n = 30 consecutive tokens in common (both texts at least n tokens long).
- subsequence: the shorter text has fewer than n tokens and is the longer one with tokens
  removed (its tokens occur in the longer in the same order), the longer has at most
  MAX_GROWTH times as many tokens, and both hold the same numbers and operators in the same
  order. Words added or removed are caught ("What exactly is 12 + 7, please?"); a changed
  word or number is not, since in a word problem one word can be the operation ("gets 15",
  "loses 15"; the embedded default's templated problems differ by substitution only), nor is
  an added number or operator ("What is 12 + 7 + 1?" is another problem).

Not caught: paraphrases and synonyms, lookalikes NFKC keeps apart (Cyrillic 'а' for Latin 'a'),
a long text with a word inserted into every run of 30 tokens, a short prompt with a number added.
"""

from __future__ import annotations

import argparse
import collections
import re
import unicodedata

from arenaflow import io

SHINGLE = 30
# The longer text of a subsequence match may have at most this many times the shorter's tokens:
# six added words on the default's 12-token word problems, two on "what is 12 + 7", none on a
# one-word prompt, so a very short eval item does not claim every training prompt that opens
# with it. A constant, not a config key: it defines contamination for every corpus alike, and
# the record carries it.
MAX_GROWTH = 1.5
PREFIXES = frozenset(
    ("question", "q", "problem", "prompt", "solve", "task", "exercise", "query", "input")
)
PROSE = frozenset(".,;:!?\"'`\u201c\u201d\u2018\u2019\u00ab\u00bb\u00bf\u00a1")
# what separates a label from the text ("Question:", "Q.", "1)")
_LABEL_END = frozenset(":.)")
# symbols a text may carry its meaning in, with digits; a subsequence match must keep them all
OPERATORS = frozenset("+-*/=<>^%()[]{}|\u221a\u2264\u2265\u2260\u00b1")
_FOLD = str.maketrans(
    {"\u2212": "-", "\u2013": "-", "\u00d7": "*", "\u2217": "*", "\u00f7": "/", "\u2215": "/"}
)
_TOKEN = re.compile(r"\d+(?:\.\d+)*|[^\W\d]+|[^\w\s]")
RULES = ("exact", "shingle", "subsequence")


def tokens(text: str) -> list[str]:
    """The normalised tokens of a text (module docstring)."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c) != "Cf")
    toks = _strip_labels(_TOKEN.findall(text.translate(_FOLD).casefold()))
    return [t for t in toks if t not in PROSE]


def _strip_labels(toks: list[str]) -> list[str]:
    """`toks` without leading labels; one that is the whole text stays (there is nothing else)."""
    while True:
        if len(toks) > 2 and toks[0] in PREFIXES and toks[1] in _LABEL_END:
            cut = 2
        elif len(toks) > 3 and toks[0] in PREFIXES and toks[1].isdigit() and toks[2] in ":.":
            cut = 3
        # list numbering is short; "2024." opening a text is more likely a year than item 2024
        elif len(toks) > 2 and toks[0].isdigit() and len(toks[0]) <= 3 and toks[1] in ".)":
            cut = 2
        else:
            return toks
        toks = toks[cut:]


def signature(toks: list[str]) -> tuple[str, ...]:
    """The numbers and operators of a token list, in order."""
    return tuple(t for t in toks if t in OPERATORS or t[0].isdigit())


def shingles(text: str, n: int = SHINGLE) -> set[tuple[str, ...]]:
    return set(_ordered_shingles(tokens(text), n))


class _EvalIndex:
    """Every eval text's normalised tokens, indexed for the three rules; the first eval item (in
    input order) that holds a key owns it, so a row's reported eval id is stable."""

    def __init__(self, evals: list[dict], fields: tuple[str, ...], n: int):
        self.n = n
        self.exact: dict[tuple[str, ...], str] = {}
        self.shingle: dict[tuple[str, ...], str] = {}
        self.near: dict[tuple[str, ...], list] = collections.defaultdict(list)
        for e in evals:
            for field in fields:
                if isinstance(e.get(field), str):
                    self._add(tuple(tokens(e[field])), str(e["id"]))

    def _add(self, toks: tuple[str, ...], eval_id: str) -> None:
        if not toks:
            return
        self.exact.setdefault(toks, eval_id)
        for s in _ordered_shingles(toks, self.n):
            self.shingle.setdefault(s, eval_id)
        if len(toks) <= MAX_GROWTH * (self.n - 1):  # could pair with a text under n tokens
            self.near[signature(toks)].append((toks, eval_id))

    def match(self, toks: tuple[str, ...]) -> tuple[str, str] | None:
        """(eval id, rule) of the first rule that matches `toks`, or None."""
        if not toks:
            return None
        if toks in self.exact:
            return self.exact[toks], "exact"
        for s in _ordered_shingles(toks, self.n):  # none for a text under n tokens
            if s in self.shingle:
                return self.shingle[s], "shingle"
        for other, eval_id in self.near.get(signature(toks), ()):
            if _near(toks, other, self.n):
                return eval_id, "subsequence"
        return None


def _near(a: tuple[str, ...], b: tuple[str, ...], n: int) -> bool:
    short, long = sorted((a, b), key=len)
    if len(short) >= n or len(long) > MAX_GROWTH * len(short):
        return False
    rest = iter(long)
    return all(t in rest for t in short)  # `in` consumes `rest`: order is kept


def decontaminate(
    train: list[dict],
    evals: list[dict],
    n: int = SHINGLE,
    train_field: str = "prompt",
    eval_fields: tuple[str, ...] = ("prompt",),
    source: str = "training rows",
) -> tuple[list[dict], dict]:
    """(kept training rows in order, record). Every field of `eval_fields` an eval item has is
    indexed; the record names each dropped id, the first eval id it matched and the rule."""
    if n < 1:
        raise ValueError(f"shingle length must be >= 1, got {n}")
    index = _EvalIndex(evals, eval_fields, n)
    kept, dropped = [], []
    for i, r in enumerate(train, start=1):
        text = r.get(train_field)
        if not isinstance(text, str):
            raise ValueError(
                f"{source}: row {i} (id {r.get('id')!r}) has no text {train_field!r} to check"
            )
        hit = index.match(tuple(tokens(text)))
        if hit is None:
            kept.append(r)
        else:
            dropped.append({"id": r["id"], "eval_id": hit[0], "rule": hit[1]})
    by_rule = collections.Counter(d["rule"] for d in dropped)
    record = {
        "shingle_tokens": n,
        "subsequence_max_growth": MAX_GROWTH,
        "stripped_prefixes": sorted(PREFIXES),
        "train_rows": len(train),
        "eval_items": len(evals),
        "kept": len(kept),
        "dropped": len(dropped),
        "dropped_by_rule": {rule: by_rule[rule] for rule in RULES},
        "dropped_ids": dropped,
    }
    return kept, record


def _ordered_shingles(toks, n: int):
    """Shingles in text order, so the eval id reported for a row does not depend on set order."""
    for i in range(len(toks) - n + 1):
        yield tuple(toks[i : i + n])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", required=True, help="training rows (JSONL with id and prompt)")
    ap.add_argument(
        "--eval", required=True, nargs="+", help="evaluation items (JSONL), one or more files"
    )
    ap.add_argument("--out", required=True, help="kept training rows (JSONL)")
    ap.add_argument("--record", required=True, help="JSON: how many were dropped and which")
    ap.add_argument("--shingle", type=int, default=SHINGLE, help="tokens per shingle")
    args = ap.parse_args(argv)
    evals = [row for path in args.eval for row in io.read_jsonl(path)]
    kept, record = decontaminate(
        io.read_jsonl(args.train), evals, n=args.shingle, source=args.train
    )
    io.write_jsonl(args.out, kept)
    io.write_json(args.record, {**record, "train": args.train, "eval": args.eval})
    print(
        f"decontam: kept {record['kept']} of {record['train_rows']}, "
        f"dropped {record['dropped']} {record['dropped_by_rule']} -> {args.out}"
    )


if __name__ == "__main__":
    main()
