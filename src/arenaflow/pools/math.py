"""Synthetic arithmetic word problems (a math pool without `file`): seeded, each with its gold
answer and a worked reference. Train and eval can never share a problem: every problem has a key
(its category and numbers), and a stable hash of that key assigns it to one split (split_of).
"""

from __future__ import annotations

import hashlib
import random

from arenaflow.pools.exclude import Excluded

CATEGORIES = ("add", "sub", "mul", "two_step")
NAMES = ("Ann", "Ben", "Cal", "Dee", "Eva", "Finn", "Gus", "Ivy", "Jo", "Kim", "Leo", "Max")
ITEMS = ("apple", "coin", "book", "card", "shell", "stamp", "egg", "pen", "cup", "bead")
EVAL_BUCKETS = 5  # 1 problem key in 5 belongs to the eval split


def split_of(key: tuple) -> str:
    """The split ('train' or 'eval') that owns a problem key, independent of any seed."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return "eval" if digest[0] % EVAL_BUCKETS == 0 else "train"


def _problem(rng: random.Random, category: str) -> tuple[tuple, str, int, str]:
    """Return (key, prompt, gold, reference) for one problem of `category`."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if category == "add":
        a, b = rng.randint(10, 59), rng.randint(10, 39)
        r = a + b
        prompt = f"{name} has {a} {item}s and gets {b} more. How many {item}s now?"
        work = f"{a} + {b} = {r}."
        key = (category, a, b)
    elif category == "sub":
        a = rng.randint(30, 99)
        b = rng.randint(10, a - 5)
        r = a - b
        prompt = f"{name} had {a} {item}s and gave away {b}. How many {item}s are left?"
        work = f"{a} - {b} = {r}."
        key = (category, a, b)
    elif category == "mul":
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        r = a * b
        prompt = f"{name} buys {a} bags with {b} {item}s each. How many {item}s in all?"
        work = f"{a} * {b} = {r}."
        key = (category, a, b)
    elif category == "two_step":
        a, b = rng.randint(10, 49), rng.randint(5, 29)
        c = rng.randint(2, a + b - 5)
        s, r = a + b, a + b - c
        prompt = f"{name} has {a} {item}s, finds {b} more, then loses {c}. How many {item}s now?"
        work = f"{a} + {b} = {s}. {s} - {c} = {r}."
        key = (category, a, b, c)
    else:
        raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")
    return key, prompt, r, f"{work} The answer is {r}."


def generate(
    n: int,
    seed: int,
    split: str,
    categories: dict[str, float],
    prefix: str,
    exclude: Excluded | None = None,
) -> list[dict]:
    """`n` distinct problems of `split`, categories drawn with the given weights, none with an
    `exclude`d prompt (those are skipped like repeats, so the draw goes on along the same seeded
    sequence)."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    exclude = exclude if exclude is not None else Excluded()
    rng = random.Random(seed)
    names, weights = list(categories), list(categories.values())
    rows, seen = [], set()
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 200 * (n + len(exclude)) + 1000:  # each excluded prompt may cost a draw
            skipped = f" ({exclude.skipped} skipped as excluded)" if exclude.skipped else ""
            raise ValueError(
                f"could only draw {len(rows)} of {n} distinct {split} problems{skipped}; "
                "lower n or widen the categories"
            )
        key, prompt, gold, reference = _problem(rng, rng.choices(names, weights)[0])
        if split_of(key) != split or key in seen or exclude.drops(prompt):
            continue
        seen.add(key)
        rows.append(
            {
                "id": f"{prefix}-{len(rows):05d}",
                "prompt": prompt,
                "gold": str(gold),
                "category": key[0],
                "source": f"synthetic:seed={seed}:key={'/'.join(map(str, key))}",
                "reference": reference,
            }
        )
    return rows
