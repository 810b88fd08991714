"""Lineage 002's toy base and chat corpus: a tiny Llama that writes short constrained answers.

    python -m arenaflow.bases.tinychat model --out models/tiny-ifchat       # the base (BUILD.json)
    python -m arenaflow.bases.tinychat chatset --n 600 --seed 5 --out data/synthchat.jsonl
    python -m arenaflow.bases.tinychat chatset --n 60 --seed 6 --split eval \
        --out data/synthchat-eval.jsonl

tiny-arith (arenaflow.bases.tinymodel) only does arithmetic, so its pass rate on constrained-writing
prompts is 0 and rejection sampling, preference pairs and the repair round have nothing to
select. This sibling has the same byte-level tokenizer and Llama shape, pretrained on synthetic
chats in which an answer about a subject obeys the constraint the prompt states (TWELVE
families of arenaflow.instruct.check, as the card's H6 had twelve). `answer()` writes those answers
from
sentence templates; every one is checked by arenaflow.instruct.check before it is used, so a
template
that breaks a constraint fails the build instead of teaching the break. Training prompts come
from arenaflow.instruct.pool's train split only, and the build keeps the first checkpoint whose
pass@1
at T=0.8 on eval-split prompts lies in [--min-pass, --max-pass], where rejection sampling has
both passes and failures to work with.

The chat set is lineage 002's stand-in for its public chat corpora (Tulu 3, SmolTalk), which
are not available offline: conversations in their format (a `messages` list of role/content
turns), plain requests, constrained ones and two-turn follow-ups, train-split subjects and
values only. Same generator, another seed than the base's pretraining.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from arenaflow import chat, io
from arenaflow.bases import tinymodel
from arenaflow.decode import sampling
from arenaflow.evals import degeneracy
from arenaflow.instruct import check as ifcheck
from arenaflow.instruct import domains as ifdomains
from arenaflow.instruct import pool as ifpool

SYSTEM_PROMPT = "You are a helpful assistant."
# the card's twelve H6 families, as far as a 0.5 M-parameter byte model can write them
FAMILIES = (
    "is_lower",
    "is_upper",
    "no_char",
    "no_digits",
    "no_word",
    "quoted",
    "postscript",
    "startswith",
    "endswith",
    "contains",
    "bullet",
    "sent",
)
# sentences of an answer: the first names the subject, the others do not (a subject in every
# sentence reads as a loop, degeneracy.is_loop), and no sentence is repeated. What a constraint
# forbids (commas, digits, filler words, capitals) occurs in unconstrained answers, so obeying
# it is a choice to learn.
_SUBJECT = (
    "{S} is worth a closer look.",
    "People have studied {s} for a long time.",
    "There is a lot to learn about {s}.",
    "{S} shows how the world works.",
    "In short, {s} is about {w}.",
    "Around {d} books cover {s}, more or less.",
)
_REST = (
    "Most of it comes down to {w}.",
    "You can see {w} in it every day.",
    "It began about {d} years ago.",
    "It is really a good place to start.",
    "Many people find it very interesting.",
)
# short sentences, so that twelve (or nine bullets) fit 512 positions with the prompt
_ITEMS = ("It takes {w}.", "It rewards {w}.", "Start small.", "Ask about {w}.", "Look closer.")
_TOPICS = ("patience", "care", "design", "motion", "craft", "change", "balance")
_REQUESTS = ("Tell me about {s}.", "What is {s}?", "Can you explain {s}?")
# follow-up turns by split: an eval conversation never repeats a training turn word for word
# (decontamination would drop the training rows that share one)
_FOLLOWUPS = {
    "train": {
        "is_upper": "Now say that again in capital letters.",
        "is_lower": "Now say that again in lowercase only.",
        "quoted": "Now put your answer in double quotes.",
    },
    "eval": {
        "is_upper": "Please repeat that, all in capitals.",
        "is_lower": "Please repeat that with no capital letters.",
        "quoted": "Please repeat that inside double quotation marks.",
    },
}


def _fill(t: str, subject: str, rng: random.Random) -> str:
    cap = subject[0].upper() + subject[1:]
    return t.format(s=subject, S=cap, w=rng.choice(_TOPICS), d=rng.randint(2, 90))


def _sentences(subject: str, rng: random.Random, k: int, allowed, first: bool = True) -> list:
    """k distinct sentences that `allowed` lets through: the subject's first (if `first`),
    then long ones while the answer is short, then short ones."""
    out: list[str] = []
    while len(out) < k:
        pool = _SUBJECT if first and not out else _REST if len(out) < 3 else _ITEMS
        s = _fill(rng.choice(pool), subject, rng)
        if allowed(s) and s not in out:
            out.append(s)
    return out


def _allowed(constraints: list[dict]):
    bans = [c for c in constraints if c["type"] in ("no_char", "no_digits", "no_word")]

    def ok(s: str) -> bool:
        return all(ifcheck.check(s, [c])["passed"] for c in bans)

    return ok


def answer(subject: str, constraints: list[dict], rng: random.Random) -> str:
    """A short answer about `subject` that satisfies every constraint (checked)."""
    by = {c["type"]: c for c in constraints}
    ok = _allowed(constraints)
    if "bullet" in by:
        items = _sentences(subject, rng, by["bullet"]["n"], ok, first=False)
        text = "\n".join(f"* {s}" for s in items)
    else:
        k = by["sent"]["n"] if "sent" in by else rng.randint(2, 3)
        if "contains" in by:
            k -= 1
        parts = _sentences(subject, rng, max(k, 0), ok)
        if "contains" in by:
            words = " and ".join(by["contains"]["words"])
            parts.insert(rng.randint(0, len(parts)), f"It is a story of {words}.")
        text = " ".join(parts)
    if "startswith" in by:
        text = f"{by['startswith']['phrase']} {text}"
    if "endswith" in by:
        text = f"{text} {by['endswith']['phrase']}"
    if "postscript" in by:
        text = f"{text}\n\n{by['postscript']['marker']} Ask me more about {subject}."
    text = text.lower() if "is_lower" in by else text.upper() if "is_upper" in by else text
    if "quoted" in by:
        text = f'"{text}"'
    result = ifcheck.check(text, constraints) if constraints else {"passed": True}
    if not result["passed"]:
        reasons = [c["reason"] for c in result["checks"] if not c["passed"]]
        raise ValueError(f"tinychat.answer broke its own constraints {constraints}: {reasons}")
    return text


def subject_of(row: dict) -> str:
    """The subject of an arenaflow.instruct.pool row (its source names the subject's index)."""
    return ifdomains.SUBJECTS[int(row["source"].split(":subject=")[1].split(":")[0])]


def examples(n: int, seed: int, split: str = "train") -> list[dict]:
    """`n` constrained prompts of `split` (one constraint each) with a checked answer."""
    rng = random.Random(seed)
    rows = ifpool.generate(n, seed, split, "tinychat", families=list(FAMILIES))
    return [{**r, "reference": answer(subject_of(r), r["constraints"], rng)} for r in rows]


def chatset(n: int, seed: int, split: str = "train") -> list[dict]:
    """`n` conversations ({id, category, messages}) on `split`'s subjects: a third plain
    requests, a third constrained ones (arenaflow.instruct.pool prompts), a third two-turn (a plain
    answer, then a constraint as a follow-up, category followup-<family>)."""
    rng = random.Random(seed)
    cons = examples(n, seed, split)
    subjects = ifpool.split_values(split)[0]
    out = []
    for i, r in enumerate(cons):
        s = rng.choice(subjects)
        plain = [
            {"role": "user", "content": rng.choice(_REQUESTS).format(s=s)},
            {"role": "assistant", "content": answer(s, [], rng)},
        ]
        kind = ("plain", "constrained", "followup")[i % 3]
        if kind == "plain":
            msgs = plain
        elif kind == "constrained":
            msgs = [
                {"role": "user", "content": r["prompt"]},
                {"role": "assistant", "content": r["reference"]},
            ]
        else:
            fam = rng.choice(sorted(_FOLLOWUPS[split]))
            msgs = plain + [
                {"role": "user", "content": _FOLLOWUPS[split][fam]},
                {"role": "assistant", "content": answer(s, [{"type": fam}], rng)},
            ]
        out.append({"id": f"synthchat-{split}-{i:05d}", "category": kind, "messages": msgs})
    return out


def _vocabulary() -> frozenset[str]:
    """Every word the generator writes, lowercased, punctuation stripped."""
    texts = [*_SUBJECT, *_REST, *_ITEMS, *_TOPICS, *ifdomains.SUBJECTS, "ask me more about p.s."]
    texts += [
        p
        for ps in (ifdomains.DOMAINS["startswith"], ifdomains.DOMAINS["endswith"])
        for p in ps["phrase"]
    ]
    texts += [*ifdomains.DOMAINS["contains"]["words"], "it is a story of and"]
    return frozenset(w for t in texts for w in _words(t))


def _words(text: str) -> list[str]:
    return [w.strip(".,!?\"'*:").lower() for w in text.replace("{", " ").replace("}", " ").split()]


def usable(text: str, stopped: bool, vocabulary: frozenset[str]) -> bool:
    """An answer, not noise: stopped, ends on a terminator, no loop (degeneracy.answer_usable),
    and at least 90 % of its words are words the generator writes. A byte-level model that has
    not learnt words yet passes no-comma, no-digit or forbidden-word prompts with noise."""
    words = [w for w in _words(text) if w and not w.isdigit()]
    known = sum(w in vocabulary for w in words) / len(words) if words else 0.0
    return degeneracy.answer_usable(text, stopped) and known >= 0.9


def _score(eval_rows: list[dict]):
    """pass@1 at T=0.8 on eval-split constrained prompts: the answer is usable and satisfies
    its constraint (arenaflow.instruct.check)."""
    vocabulary = _vocabulary()

    def score(model, tokenizer, seed: int) -> float:
        prompts = [
            chat.render(chat.prompt_messages(SYSTEM_PROMPT, r["prompt"]), True) for r in eval_rows
        ]
        dec = sampling.Decoding(temperature=0.8, max_new_tokens=200)
        outs = sampling.generate(
            model, tokenizer, prompts, dec, k=1, seed=seed, batch_size=200, desc="pass@1"
        )
        passed = [
            ifcheck.check(o[0]["text"], r["constraints"])["passed"]
            and usable(o[0]["text"], o[0]["stopped"], vocabulary)
            for o, r in zip(outs, eval_rows)
        ]
        return sum(passed) / len(passed)

    return score


def build_model(args) -> tuple[dict, dict]:
    rng = random.Random(args.seed)
    tokenizer = tinymodel.build_tokenizer()
    model = tinymodel.build_model(tokenizer, args.seed)
    rows = examples(args.n_train, args.seed)
    # eval split: subjects and constraint values no training prompt has
    eval_rows = ifpool.generate(args.n_eval, args.seed + 1, "eval", "tinychat-eval", list(FAMILIES))

    def example(r):
        system = SYSTEM_PROMPT if rng.random() < 0.5 else None
        msgs = chat.prompt_messages(system, r["prompt"])
        return chat.encode_with_mask(
            tokenizer, msgs + [{"role": "assistant", "content": r["reference"]}]
        )

    encoded = [example(r) for r in rows]
    model, record = tinymodel.fit(model, tokenizer, encoded, rng, _score(eval_rows), args)
    return {"model": model, "tokenizer": tokenizer}, record


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model", help="pretrain the tiny constrained-writing base")
    # batch 16, not tiny-arith's 64: its rows are ~5x longer (1.4 s a step on 2 shared cores)
    tinymodel.add_train_args(m, out="models/tiny-ifchat", n_train=20000, lo=0.3, hi=0.6, batch=16)
    m.add_argument("--n-eval", type=int, default=120, help="eval-split prompts for pass@1")
    c = sub.add_parser("chatset", help="write the synthetic chat corpus (messages lists)")
    c.add_argument("--n", type=int, default=480)
    c.add_argument("--seed", type=int, default=5)
    c.add_argument("--split", choices=("train", "eval"), default="train")
    c.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "chatset":
        rows = chatset(args.n, args.seed, args.split)
        io.write_jsonl(args.out, rows)
        print(f"{len(rows)} conversations -> {args.out}")
        return
    built, record = build_model(args)
    cmd = "python -m arenaflow.bases.tinychat " + " ".join(sys.argv[1:] if argv is None else argv)
    tinymodel.save(Path(args.out), built, record, cmd, SYSTEM_PROMPT, args)


if __name__ == "__main__":
    main()
