"""Instruction-following prompt pools: a subject and one or more checkable constraints per prompt.

Drawn, seeded, from arenaflow.instruct.domains for `kind: ifeval` pools (python -m
arenaflow.pools.build --pool P --params-json '{"kind": "ifeval", "n": 400, "seed": 1, "split":
"train"}' --out pools/P.jsonl); train and eval share no subject or value (split_values).
"""

from __future__ import annotations

import hashlib
import json
import random

from arenaflow.instruct import constraints as ifconstraints
from arenaflow.instruct import probe as ifprobe
from arenaflow.instruct.domains import (
    CONFLICTS,
    DOMAINS,
    FIXED,
    FOLLOW_UPS,
    KEEP,
    LIST_SIZES,
    SOLO,
    SUBJECTS,
    TASKS,
)

SPLITS = ("train", "eval", "probe")
EVAL_SHARE = 5  # about 1 value in 5 of every range (at least 1) belongs to eval


def _rank(tag: tuple) -> bytes:
    return hashlib.sha256(repr(tag).encode()).digest()


def partition(tag: str, domain: tuple) -> dict[str, tuple]:
    """{'train': values, 'eval': values} of `domain`: the ceil(len/EVAL_SHARE) values with the
    smallest hash rank go to eval (so both sides are non-empty), in domain order."""
    if len(domain) < 2:
        raise ValueError(f"{tag}: a range of {len(domain)} value(s) cannot be split")
    k = -(-len(domain) // EVAL_SHARE)
    eval_set = set(sorted(domain, key=lambda v: _rank((tag, v)))[:k])
    return {
        "eval": tuple(v for v in domain if v in eval_set),
        "train": tuple(v for v in domain if v not in eval_set),
    }


def split_values(split: str) -> tuple[tuple, dict[tuple[str, str], tuple]]:
    """(subjects, {(family, param): values}) of `split`. As lineage 002 did
    (docs/lineages.md#002-sft-dpo-and-if-repair): subjects x constraint templates, each
    constraint's values spread over its range (every value of the split's range is drawn once
    before any repeats), seeded, and disjoint between the train and eval splits: every subject and
    every value of every constraint parameter belongs to exactly one split, fixed by a hash of
    (family, param, value) and independent of the seed, so no eval prompt shares a subject or a
    value with any training prompt. Families with no value (no commas, all caps, quoted, ...)
    differ between the splits only by subject. The third split, `probe` (arenaflow.instruct.probe:
    lineage 002's probe2), shares no subject, task template, constraint phrasing or constraint
    value with either: its values lie past the edges of the train/eval ranges."""
    if split == "probe":
        values = {(f, p): d for f, ps in ifprobe.PROBE_DOMAINS.items() for p, d in ps.items()}
        return ifprobe.PROBE_SUBJECTS, values
    subjects = partition("subject", SUBJECTS)[split]
    values = {
        (f, p): partition(f"{f}.{p}", d)[split] for f, ps in DOMAINS.items() for p, d in ps.items()
    }
    return subjects, values


class _Deck:
    """Draws values so that each is used once before any is reused (spread over the range)."""

    def __init__(self, values: tuple, rng: random.Random):
        self.values, self.rng, self.left = list(values), rng, []

    def draw(self, k: int = 1) -> list:
        out = []
        while len(out) < k:
            if not self.left:
                self.left = self.rng.sample(self.values, len(self.values))
            v = self.left.pop()
            if v not in out:
                out.append(v)
            elif len(self.values) < k:
                raise ValueError(f"cannot draw {k} distinct values from {self.values}")
        return out


def _voice(split: str) -> tuple:
    """(tasks, describe, source key, subjects `source` indexes, follow-ups, keep sentence) of a
    split: the probe has its own tasks, phrasings and subjects."""
    if split == "probe":
        return (
            ifprobe.PROBE_TASKS,
            ifprobe.describe,
            "probe_subject",
            ifprobe.PROBE_SUBJECTS,
            ifprobe.PROBE_FOLLOW_UPS,
            ifprobe.PROBE_KEEP,
        )
    return TASKS, ifconstraints.describe, "subject", SUBJECTS, FOLLOW_UPS, KEEP


def generate(
    n: int,
    seed: int,
    split: str,
    prefix: str,
    families: list[str] | None = None,
    max_constraints: int = 1,
) -> list[dict]:
    """`n` distinct prompts of `split`; each carries 1..max_constraints constraints of distinct,
    compatible families; its category is its first (primary) constraint's family."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    families = list(families or DOMAINS)
    unknown = [f for f in families if f not in DOMAINS]
    if unknown:
        raise ValueError(f"unknown constraint families {unknown}; known: {list(DOMAINS)}")
    rng = random.Random(seed)
    subjects, values = split_values(split)
    tasks, describe, where, named = _voice(split)[:4]
    decks = {key: _Deck(v, rng) for key, v in values.items()}
    subject_deck, primary_deck = _Deck(subjects, rng), _Deck(tuple(families), rng)
    rows, seen, attempts = [], set(), 0
    while len(rows) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(
                f"could only draw {len(rows)} of {n} distinct {split} prompts; "
                "lower n or allow more constraint families"
            )
        chosen = [primary_deck.draw()[0]]
        want = 1 if chosen[0] in SOLO else rng.randint(1, max_constraints)
        others = [f for f in families if f not in SOLO and f != chosen[0]]
        rng.shuffle(others)
        for f in others:
            if len(chosen) >= want:
                break
            if all(frozenset((f, c)) not in CONFLICTS for c in chosen):
                chosen.append(f)
        constraints = [_constraint(f, decks, rng) for f in chosen]
        subject, task = subject_deck.draw()[0], rng.randrange(len(tasks))
        key = (subject, task, json.dumps(constraints, sort_keys=True))
        if key in seen:
            continue
        seen.add(key)
        prompt = " ".join([tasks[task].format(s=subject), *(describe(c) for c in constraints)])
        rows.append(
            {
                "id": f"{prefix}-{len(rows):05d}",
                "prompt": prompt,
                "constraints": constraints,
                "category": constraints[0]["type"],
                "source": f"synthetic-if:seed={seed}:{where}={named.index(subject)}:task={task}",
            }
        )
    return rows


def _constraint(family: str, decks: dict, rng: random.Random) -> dict:
    c = {"type": family, **FIXED.get(family, {})}
    for param in [p for f, p in decks if f == family]:  # the split's params (DOMAINS order)
        deck = decks[(family, param)]
        if family in LIST_SIZES:
            lo, hi = LIST_SIZES[family]
            c[param] = deck.draw(min(rng.randint(lo, hi), len(deck.values)))
        else:
            c[param] = deck.draw()[0]
    return ifconstraints.validate(c)


def _turn_families(families: list[str], turns: int, primary: str, rng: random.Random) -> list:
    """`turns` distinct, pairwise compatible families starting with `primary` (fewer if the
    families left cannot extend it)."""
    chosen = [primary]
    others = [f for f in families if f != primary]
    rng.shuffle(others)
    for f in others:
        if len(chosen) >= turns:
            break
        if all(frozenset((f, c)) not in CONFLICTS for c in chosen):
            chosen.append(f)
    return chosen


def conversations(
    n: int, seed: int, split: str, prefix: str, turns: int, families: list[str] | None = None
) -> list[dict]:
    """`n` distinct conversations of `turns` user messages (lineage 002's four-turn read): the
    first a task about a subject with one constraint, each later one a follow-up that adds one
    constraint of another compatible family which holds from then on, so turn k is checked
    against constraints[:k]. Rows: prompt (the first message), turns (every message),
    constraints (one per turn), category (the first constraint's family). Format-only families
    (SOLO: the whole answer is JSON or a table) are left out: later turns could not keep them."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    unknown = [f for f in (families or []) if f not in DOMAINS]
    families = [f for f in (families or DOMAINS) if f not in SOLO and f in DOMAINS]
    if unknown or not 2 <= turns <= len(FOLLOW_UPS) + 1:
        raise ValueError(
            f"conversations: turns must be 2..{len(FOLLOW_UPS) + 1} (got {turns}) over known "
            f"families (unknown: {unknown}; format-only, left out: {sorted(SOLO)})"
        )
    rng = random.Random(seed)
    subjects, values = split_values(split)
    tasks, describe, where, named, follow_ups, keep = _voice(split)
    decks = {key: _Deck(v, rng) for key, v in values.items()}
    subject_deck, primary_deck = _Deck(subjects, rng), _Deck(tuple(families), rng)
    rows, seen = [], set()
    for _ in range(50 * n + 1000):
        if len(rows) == n:
            break
        chosen = _turn_families(families, turns, primary_deck.draw()[0], rng)
        if len(chosen) < turns:
            continue
        constraints = [_constraint(f, decks, rng) for f in chosen]
        subject, task = subject_deck.draw()[0], rng.randrange(len(tasks))
        later = rng.sample(range(len(follow_ups)), turns - 1)
        key = (subject, task, tuple(later), json.dumps(constraints, sort_keys=True))
        if key in seen:
            continue
        seen.add(key)
        messages = [f"{tasks[task].format(s=subject)} {describe(constraints[0])}"] + [
            f"{follow_ups[j]} {keep.format(c=describe(c))}" for j, c in zip(later, constraints[1:])
        ]
        rows.append(
            {
                "id": f"{prefix}-{len(rows):05d}",
                "prompt": messages[0],
                "turns": messages,
                "constraints": constraints,
                "category": constraints[0]["type"],
                "source": f"synthetic-if-turns:seed={seed}:{where}={named.index(subject)}:"
                f"task={task}:follow={','.join(map(str, later))}",
            }
        )
    if len(rows) < n:
        raise ValueError(f"could only draw {len(rows)} of {n} distinct {split} conversations")
    return rows
