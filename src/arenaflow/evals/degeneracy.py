"""Degeneracy predicates for sampled text: loops, low n-gram uniqueness, empty, truncated, U+FFFD.

Lineage 000 names two repetition measures that disagree in principle, so both are here
(docs/lineages.md#000-two-repetition-measures):
- the scorer's loop predicate: rep_ratio(text, n=6) >= 0.25;
- the corpus builder's filter: ngram_unique_fraction(text, n=8, stride=4) < 0.7.

    python -m arenaflow.evals.degeneracy --samples candidates/C/samples.jsonl   # flag rates per
    flag

Tokens are `text.split()` (whitespace, case and punctuation kept), so a loop is exact repetition.
"""

from __future__ import annotations

import argparse
import json

from arenaflow import io

LOOP_N, LOOP_THRESHOLD = 6, 0.25
UNIQUE_N, UNIQUE_STRIDE, UNIQUE_THRESHOLD = 8, 4, 0.7


def rep_ratio(text: str, n: int = LOOP_N) -> float:
    """Fraction of the word n-grams of `text` that repeat an earlier n-gram.

    With tokens t = text.split() and the len(t) - n + 1 overlapping n-grams g_i = t[i:i+n],
    rep_ratio = #{i : g_i == g_j for some j < i} / (len(t) - n + 1)
              = 1 - (distinct n-grams) / (all n-grams).
    0.0 when the text has fewer than n tokens (nothing can repeat). A phrase of n + p tokens
    repeated r times gives about (r - 1) / r.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    tokens = text.split()
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def ngram_unique_fraction(text: str, n: int = UNIQUE_N, stride: int = UNIQUE_STRIDE) -> float:
    """Distinct / all among the word n-grams starting at tokens 0, stride, 2*stride, ...
    (those that fit entirely in the text). 1.0 when the text has fewer than n tokens."""
    if n < 1 or stride < 1:
        raise ValueError(f"n and stride must be >= 1, got n={n}, stride={stride}")
    tokens = text.split()
    grams = [tuple(tokens[i : i + n]) for i in range(0, len(tokens) - n + 1, stride)]
    return len(set(grams)) / len(grams) if grams else 1.0


def is_loop(text: str) -> bool:
    return rep_ratio(text, LOOP_N) >= LOOP_THRESHOLD


# lineage 002's "answer-usable" (docs/lineages.md#002-headline-reads): the last character, after
# closing quotes, brackets and markdown emphasis, ends a sentence; an answer may also end on the
# closing fence of a code block
TERMINATORS = ".!?\u2026\u3002\uff01\uff1f"  # . ! ? … 。 ！ ？
_CLOSERS = "\"'\u201d\u2019)]*_"


def ends_on_terminator(text: str) -> bool:
    s = text.rstrip()
    if s.endswith("```") and s.count("```") % 2 == 0:
        return True
    s = s.rstrip(_CLOSERS)
    return bool(s) and s[-1] in TERMINATORS


def answer_usable(text: str, stopped: bool) -> bool:
    """Stopped, non-empty, ends on a terminator, and no degenerate repetition (is_loop)."""
    return bool(stopped) and bool(text.strip()) and ends_on_terminator(text) and not is_loop(text)


def flags(text: str, stopped: bool) -> dict[str, bool]:
    """Every degeneracy flag of one sample; `stopped` is whether it ended on a stop token."""
    return {
        "empty": not text.strip(),
        "loop": is_loop(text),
        "low_unique": ngram_unique_fraction(text) < UNIQUE_THRESHOLD,
        "truncated": not stopped,
        "fffd": "\ufffd" in text,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", required=True, help="JSONL with 'text' and 'stopped' per row")
    args = ap.parse_args(argv)
    rows = io.read_jsonl(args.samples)
    counts = dict.fromkeys(("empty", "loop", "low_unique", "truncated", "fffd"), 0)
    for r in rows:
        for k, v in flags(r["text"], bool(r["stopped"])).items():
            counts[k] += v
    n = max(len(rows), 1)
    print(json.dumps({"samples": len(rows), **{k: round(v / n, 4) for k, v in counts.items()}}))


if __name__ == "__main__":
    main()
