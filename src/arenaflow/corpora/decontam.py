"""Decontamination: drop every training row whose prompt shares a 30-token shingle with any
evaluation item, and record how many were dropped and which (with the eval item hit).

    python -m arenaflow.corpora.decontam --train pools/math_r1.jsonl --eval pools/math_eval.jsonl
        --out pools/math_r1.clean.jsonl --record pools/math_r1.decontam.json

Tokens are the lowercased whitespace tokens of a text; a shingle is a run of n = 30 consecutive
tokens. A text shorter than n tokens has no such run, so its whole token sequence stands in as
its one shingle: an exact (case- and spacing-insensitive) duplicate of a short prompt is still
caught, which matters for short pools such as the embedded default's arithmetic prompts.
"""

from __future__ import annotations

import argparse

from arenaflow import io

SHINGLE = 30


def tokens(text: str) -> list[str]:
    return text.lower().split()


def shingles(text: str, n: int = SHINGLE) -> set[tuple[str, ...]]:
    return set(_ordered_shingles(text, n))


def decontaminate(
    train: list[dict],
    evals: list[dict],
    n: int = SHINGLE,
    train_field: str = "prompt",
    eval_fields: tuple[str, ...] = ("prompt",),
) -> tuple[list[dict], dict]:
    """(kept training rows in order, record). Every field of `eval_fields` an eval item has
    is shingled; the record names each dropped id and the first eval id it collided with."""
    if n < 1:
        raise ValueError(f"shingle length must be >= 1, got {n}")
    owner: dict[tuple[str, ...], str] = {}
    for e in evals:
        for field in eval_fields:
            if isinstance(e.get(field), str):
                for s in shingles(e[field], n):
                    owner.setdefault(s, str(e["id"]))
    kept, dropped = [], []
    for r in train:
        hit = next((owner[s] for s in _ordered_shingles(r[train_field], n) if s in owner), None)
        if hit is None:
            kept.append(r)
        else:
            dropped.append({"id": r["id"], "eval_id": hit})
    record = {
        "shingle_tokens": n,
        "train_rows": len(train),
        "eval_items": len(evals),
        "kept": len(kept),
        "dropped": len(dropped),
        "dropped_ids": dropped,
    }
    return kept, record


def _ordered_shingles(text: str, n: int):
    """Shingles in text order, so the eval id reported for a row does not depend on set order."""
    t = tokens(text)
    if len(t) < n:
        yield from ([tuple(t)] if t else [])
    else:
        for i in range(len(t) - n + 1):
            yield tuple(t[i : i + n])


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
    kept, record = decontaminate(io.read_jsonl(args.train), evals, n=args.shingle)
    io.write_jsonl(args.out, kept)
    io.write_json(args.record, {**record, "train": args.train, "eval": args.eval})
    print(
        f"decontam: kept {record['kept']} of {record['train_rows']}, "
        f"dropped {record['dropped']} -> {args.out}"
    )


if __name__ == "__main__":
    main()
