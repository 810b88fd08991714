"""Prompt pools: seeded synthetic arithmetic word problems with gold answers and categories.

Consumes a pool's config section; produces pools/{pool}.jsonl with one row per prompt:
id, prompt, gold, category, source, reference (a worked solution).

    python -m arenaflow.pools --pool math_eval --params-json '{"n": 200, ...}' --out pools/math_eval.jsonl

Train and eval pools can never share a problem: every problem has a key (its category and
numbers), and a stable hash of that key assigns it to exactly one split.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re

from arenaflow import io

CATEGORIES = ("add", "sub", "mul", "two_step")
NAMES = ("Ann", "Ben", "Cal", "Dee", "Eva", "Finn", "Gus", "Ivy", "Jo", "Kim", "Leo", "Max")
ITEMS = ("apple", "coin", "book", "card", "shell", "stamp", "egg", "pen", "cup", "bead")
EVAL_BUCKETS = 5  # 1 problem key in 5 belongs to the eval split
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


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
    n: int, seed: int, split: str, categories: dict[str, float], prefix: str
) -> list[dict]:
    """`n` distinct problems of `split`, categories drawn with the given weights."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    rng = random.Random(seed)
    names, weights = list(categories), list(categories.values())
    rows, seen = [], set()
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > 200 * n + 1000:
            raise ValueError(
                f"could only draw {len(rows)} of {n} distinct {split} problems; "
                "lower n or widen the categories"
            )
        key, prompt, gold, reference = _problem(rng, rng.choices(names, weights)[0])
        if split_of(key) != split or key in seen:
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


def validate_rows(rows: list[dict], path: str) -> None:
    """Fail on the first bad row with path:line and the reason; nothing is skipped."""
    seen: dict[str, int] = {}
    for line, row in enumerate(rows, start=1):
        for field in ("id", "prompt", "gold", "category"):
            if not isinstance(row.get(field), str) or not row[field]:
                raise ValueError(f"{path}:{line}: missing or empty {field!r}")
        if not ID_RE.match(row["id"]):
            raise ValueError(f"{path}:{line}: id {row['id']!r} has characters outside {ID_RE.pattern}")
        if row["id"] in seen:
            raise ValueError(f"{path}:{line}: duplicate id {row['id']!r} (first on line {seen[row['id']]})")
        seen[row["id"]] = line


def build(pool: str, params: dict) -> list[dict]:
    rows = generate(
        n=params["n"],
        seed=params["seed"],
        split=params["split"],
        categories=params["categories"],
        prefix=pool,
    )
    validate_rows(rows, f"pools/{pool}.jsonl")
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", required=True, help="pool id (prefix of every row id)")
    ap.add_argument("--params-json", required=True, help="the pool's config section as JSON")
    ap.add_argument("--out", required=True, help="pools/{pool}.jsonl")
    args = ap.parse_args(argv)
    rows = build(args.pool, json.loads(args.params_json))
    io.write_jsonl(args.out, rows)
    print(f"pool {args.pool}: {len(rows)} rows -> {args.out}")


if __name__ == "__main__":
    main()
