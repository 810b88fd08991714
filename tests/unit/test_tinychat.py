"""arenaflow.bases.tinychat: lineage 002's toy base and chat corpus. Its answers satisfy their
constraints by arenaflow.instruct.check (an independent checker), unconstrained answers break each
ban
now and then (so obeying one is learnt), the shipped files are what the generator writes, and
the shipped model is the one its BUILD.json names."""

from __future__ import annotations

import json
import random

import pytest

from arenaflow import chat, io, manifest
from arenaflow.bases import tinychat
from arenaflow.instruct import check as ifcheck
from arenaflow.instruct import pool as ifpool
from arenaflow.pools import build as pools

REPO_DATA = {
    "train": ("data/synthchat.jsonl", 600, 5),
    "eval": ("data/synthchat-eval.jsonl", 60, 6),
}


@pytest.mark.parametrize("split", ["train", "eval"])
def test_every_answer_satisfies_its_constraint_and_is_usable(split):
    rows = tinychat.examples(600, 7, split)
    vocab = tinychat._vocabulary()
    assert {r["category"] for r in rows} == set(tinychat.FAMILIES)
    for r in rows:
        assert ifcheck.check(r["reference"], r["constraints"])["passed"], r
        assert tinychat.usable(r["reference"], True, vocab), r["reference"]


def test_unconstrained_answers_break_each_ban_now_and_then():
    rng = random.Random(0)
    texts = [tinychat.answer("volcanoes", [], rng) for _ in range(300)]
    bans = [
        {"type": "no_char", "chars": ","},
        {"type": "no_digits"},
        {"type": "no_word", "words": ["really", "very", "many"]},
    ]
    for ban in bans:
        broken = sum(not ifcheck.check(t, [ban])["passed"] for t in texts)
        assert 0.05 < broken / len(texts) < 0.8, (ban, broken)


def test_noise_is_not_usable():
    vocab = tinychat._vocabulary()
    assert not tinychat.usable("Xq zzk aa bbq hh.", True, vocab)
    assert not tinychat.usable("Volcanoes is worth a closer look.", False, vocab)  # not stopped
    assert tinychat.usable("Volcanoes is worth a closer look. Start small.", True, vocab)


def test_a_generator_that_broke_a_constraint_fails_loudly():
    with pytest.raises(ValueError, match="broke its own constraints"):
        tinychat.answer(
            "volcanoes", [{"type": "sent", "n": 2}, {"type": "word_max", "n": 3}], random.Random(0)
        )


@pytest.mark.parametrize("split", ["train", "eval"])
def test_the_shipped_chat_sets_are_the_generators_output(split, repo_root):
    path, n, seed = REPO_DATA[split]
    shipped = io.read_jsonl(repo_root / path)
    assert shipped == json.loads(json.dumps(tinychat.chatset(n, seed, split)))
    rows = pools.build("c", {"kind": "chat", "file": path})  # imports as lineage 002's pools do
    assert {r["category"] for r in rows} == {"plain", "constrained", "followup"}
    assert sum("context" in r for r in rows) == n // 3


def test_eval_conversations_share_no_subject_and_no_user_turn_with_training(repo_root):
    train, ev = (io.read_jsonl(repo_root / REPO_DATA[s][0]) for s in ("train", "eval"))
    users = lambda rows: {m["content"] for r in rows for m in r["messages"] if m["role"] == "user"}  # noqa: E731
    assert not users(train) & users(ev)
    eval_subjects = set(ifpool.split_values("eval")[0])
    train_text = " ".join(m["content"] for r in train for m in r["messages"])
    assert not [s for s in eval_subjects if s in train_text]


def test_the_shipped_base_is_the_one_its_build_record_names(repo_root):
    d = repo_root / "models/tiny-ifchat"
    build = json.loads((d / "BUILD.json").read_text())
    assert build["weights_sha256"] == manifest.sha256_file(d / "model.safetensors")
    # the builder as it was named when the base was built (now arenaflow.bases.tinychat): the
    # record is left as written, since the base's files are every job's inputs
    assert build["command"].startswith("python -m arenaflow.tinychat model")
    lo, hi = build["args"]["min_pass"], build["args"]["max_pass"]
    assert lo <= build["chosen"]["pass_at_1"] <= hi
    assert chat.CHATML_TEMPLATE == (d / "chat_template.jinja").read_text()
