"""Scaffolded generation (lineage 003's lensyn stage): sampled under the scaffold's system
message, only the final answer verified, and trained on bare under the serving system prompt."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml

from arenaflow import candidates, chat, config, manifest, schema
from arenaflow.bases import tinymodel
from arenaflow.corpora import build as corpora
from arenaflow.decode import sampling

SERVING = "You follow instructions precisely."
SCAFFOLD = {
    "system": "Draft, count every word, revise, then print FINAL: and the answer.",
    "marker": "FINAL:",
}
POOL = [
    {
        "id": "q0",
        "category": "word_eq",
        "prompt": "Describe rain.",
        "constraints": [{"type": "word_eq", "n": 3}],
    },
    {
        "id": "q1",
        "category": "word_eq",
        "prompt": "Describe snow.",
        "constraints": [{"type": "word_eq", "n": 2}],
    },
]
# q0#0: a draft of 5 words that fails, a final of 3 that passes; q0#1: no marker, though the
# whole text (3 words) would pass; q1#0: a draft of 2 words that passes, a final of 4 that fails;
# q1#1: a marker with nothing after it
TEXTS = {
    "q0#0": "Draft: rain falls on roofs. Count: 5, too many.\nFINAL: Rain falls softly.",
    "q0#1": "Rain falls softly.",
    "q1#0": "Snow falls.\nFINAL: Snow falls very quietly.",
    "q1#1": "Draft: snow falls. FINAL:   ",
}


def samples():
    return [
        {
            "id": i,
            "prompt_id": i.split("#")[0],
            "sample": int(i[-1]),
            "text": t,
            "n_tokens": len(t),
            "stopped": True,
        }
        for i, t in TEXTS.items()
    ]


def verdicts():
    return candidates.verify_all(POOL, samples(), "samples.jsonl", marker="FINAL:")


def test_only_the_final_answer_is_verified():
    v = {x["id"]: x for x in verdicts()}
    assert v["q0#0"]["correct"] and v["q0#0"]["final"] == "Rain falls softly."
    assert v["q0#0"]["chars"] == len("Rain falls softly.")
    # the draft passed word_eq 2; the final answer has 4 words
    assert not v["q1#0"]["correct"]
    assert v["q1#0"]["reasons"] == ["word_eq: 4 words, expected 2"]
    # without a marker the same checks pass on the whole text: the verdict must not look there
    assert candidates.verdict(samples()[0] | {"text": TEXTS["q0#1"]}, POOL[0])["correct"]


def test_a_sample_without_the_marker_is_rejected_with_a_reason():
    v = {x["id"]: x for x in verdicts()}
    assert not v["q0#1"]["correct"] and v["q0#1"]["final"] is None
    assert v["q0#1"]["reasons"] == ["scaffold: no 'FINAL:' marker"]
    assert not v["q1#1"]["correct"]
    assert v["q1#1"]["reasons"] == ["scaffold: nothing after the 'FINAL:' marker"]


def test_the_corpus_trains_on_the_bare_final_answer_under_the_serving_prompt(tmp_path):
    tok = tinymodel.build_tokenizer()
    params = {"k": 2, "seed": 0, "select": "median", "min_chars": 0, "scaffold": SCAFFOLD}
    stats = corpora.build(tmp_path / "c", POOL, tok, SERVING, params, samples(), verdicts())
    assert stats["rows"] == 1 and stats["unsolved_dropped"] == 1
    rows = [json.loads(x) for x in (tmp_path / "c/rows.jsonl").read_text().splitlines()]
    assert rows[0]["completion"] == "Rain falls softly."
    assert rows[0]["completion_sha256"] == manifest.sha256_text("Rain falls softly.")
    npz = np.load(tmp_path / "c/sft.npz")
    text = tok.decode(npz["input_ids"].tolist())
    want = chat.render(
        chat.prompt_messages(SERVING, "Describe rain.")
        + [{"role": "assistant", "content": "Rain falls softly."}]
    )
    assert text == want
    for leak in ("FINAL:", "Draft", "Count", SCAFFOLD["system"]):
        assert leak not in text and leak not in json.dumps(rows)
    supervised = tok.decode(npz["input_ids"][npz["loss_mask"] == 1].tolist())
    assert supervised == "Rain falls softly.<|im_end|>"


def test_verdicts_made_without_the_marker_are_refused():
    plain = candidates.verify_all(POOL, samples(), "samples.jsonl")
    with pytest.raises(ValueError, match=r"verdict 'q0#0' has no 'final' answer.*--marker"):
        corpora.select(
            POOL,
            samples(),
            plain,
            {"k": 2, "seed": 0, "select": "median", "min_chars": 0, "scaffold": SCAFFOLD},
        )


def test_sampling_uses_the_scaffold_system_message(monkeypatch):
    seen = {}

    def fake_generate(model, tokenizer, prompts, dec, k, **kw):
        seen["prompts"] = prompts
        return [[{"text": "FINAL: x", "n_tokens": 3, "stopped": True}] * k for _ in prompts]

    monkeypatch.setattr(sampling, "generate", fake_generate)
    candidates.sample(POOL, None, None, SERVING, {"k": 1, "scaffold": SCAFFOLD})
    assert seen["prompts"][0] == chat.render(
        chat.prompt_messages(SCAFFOLD["system"], "Describe rain."), True
    )
    candidates.sample(POOL, None, None, SERVING, {"k": 1})
    assert SERVING in seen["prompts"][0]


def test_config_fills_the_marker_and_refuses_a_reference_scaffold(repo_root):
    raw = yaml.safe_load((repo_root / "config/config.yaml").read_text())
    cfg = copy.deepcopy(raw)
    cfg["corpora"]["rft_r1"]["scaffold"] = {"system": "draft then FINAL:"}
    res = config.resolve(cfg, repo_root=repo_root, config_file="c.yaml")
    assert res["corpora"]["rft_r1"]["scaffold"] == {
        "system": "draft then FINAL:",
        "marker": "FINAL:",
    }
    assert '"scaffold"' in schema.sampling_params(res["corpora"]["rft_r1"])
    cfg = copy.deepcopy(raw)
    cfg["corpora"]["sft_s1"]["scaffold"] = {"system": "x"}
    with pytest.raises(config.ConfigError, match=r"corpora/sft_s1/scaffold'.*reference"):
        config.resolve(cfg, repo_root=repo_root, config_file="c.yaml")
