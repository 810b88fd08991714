"""The multiple-choice guard: log-likelihoods equal lm-evaluation-harness's HFLM on the tiny
model, and acc / acc_norm / acc_bytes equal lm-eval's own process_results, also where they
disagree; the shipped set loads; bad items are named by file:line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from arenaflow import manifest, models
from arenaflow.evals import mcguard

SET = "data/mc/arith_facts.jsonl"


@pytest.fixture(scope="module")
def tiny(repo_root):
    model, tok = models.load_policy(repo_root / "models/tiny-arith", None)
    return model, tok


def lm_eval_metrics(choices: list[str], gold: int, lls: list[float]) -> dict:
    """lm-eval's ConfigurableTask.process_results for a multiple_choice doc, called on an object
    that carries only what that branch reads."""
    from lm_eval.api.task import ConfigurableTask

    task = SimpleNamespace(
        config=SimpleNamespace(process_results=None),
        OUTPUT_TYPE="multiple_choice",
        _metric_fn_list={"acc": None, "acc_norm": None, "acc_bytes": None},
        doc_to_choice=lambda doc: choices,
        doc_to_target=lambda doc: gold,
        doc_to_text=lambda doc: "q",
        multiple_input=False,
        multiple_target=False,
    )
    return ConfigurableTask.process_results(task, {}, [(ll, False) for ll in lls])


def test_loglikelihoods_equal_lm_eval_hflm_on_the_tiny_model(tiny, repo_root):
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    items = mcguard.load_items(repo_root / SET)[:3] + [
        {"id": "x", "question": "Trailing space? ", "choices": ["12", "naïve"], "gold": 0}
    ]
    pairs = [(mcguard.context(it), " " + c) for it in items for c in it["choices"]]
    lm = HFLM(pretrained=str(repo_root / "models/tiny-arith"), device="cpu", batch_size=1)
    want = [
        ll
        for ll, _ in lm.loglikelihood(
            [
                Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i)
                for i, p in enumerate(pairs)
            ],
            disable_tqdm=True,
        )
    ]
    model, tok = tiny
    got = [mcguard.loglikelihood(model, tok, c, x) for c, x in pairs]
    assert got == pytest.approx(want, abs=1e-4)
    assert len(set(round(g, 3) for g in got)) > 1  # not a constant


@pytest.mark.parametrize(
    "choices, gold, lls, expect",
    [
        # acc picks the short choice, acc_norm (per character) the long one
        (["a", "bbbbbbbb"], 1, [-2.0, -8.0], (0.0, 1.0, 1.0)),
        # characters and bytes disagree: "ééé" is 3 characters and 6 bytes
        (["ééé", "abcd"], 1, [-3.3, -4.0], (0.0, 1.0, 0.0)),
        (["ééé", "abcd"], 0, [-3.3, -4.0], (1.0, 0.0, 1.0)),
        # a tie goes to the first choice (numpy.argmax)
        (["xy", "zw"], 1, [-1.0, -1.0], (0.0, 0.0, 0.0)),
    ],
)
def test_metrics_equal_lm_evals_process_results(choices, gold, lls, expect):
    res = mcguard.metrics([{"id": "i", "choices": choices, "gold": gold}], [lls])
    ref = lm_eval_metrics(choices, gold, lls)
    assert (res["acc"], res["acc_norm"], res["acc_bytes"]) == expect
    assert (ref["acc"], ref["acc_norm"], ref["acc_bytes"]) == expect


def test_the_shipped_set_scores_on_the_tiny_model_and_reloads(tiny, repo_root, tmp_path):
    items = mcguard.load_items(repo_root / SET)
    assert len(items) == 40 and {len(it["choices"]) for it in items} == {4}
    model, tok = tiny
    res = mcguard.score(model, tok, items[:4])
    for it, row in zip(items[:4], res["items"]):
        want = lm_eval_metrics(it["choices"], it["gold"], row["lls"])
        assert (row["pred"] == it["gold"]) == bool(want["acc"])
        assert (row["pred_norm"] == it["gold"]) == bool(want["acc_norm"])
    out = tmp_path / "g.json"
    mcguard.main(
        [
            "--items",
            str(repo_root / SET),
            "--base-model",
            str(repo_root / "models/tiny-arith"),
            "--arm",
            "base",
            "--out",
            str(out),
        ]
    )
    rec = manifest.check_seal(json.loads(out.read_text()), out)
    assert rec["n"] == 40 and 0.0 <= rec["acc_norm"] <= 1.0
    assert rec["seconds"] > 0  # the scoring's wall time: the GPU-minute budget counts it spent
    for a, b in zip(rec["items"], res["items"]):
        assert a["lls"] == pytest.approx(b["lls"]) and a["pred"] == b["pred"]


@pytest.mark.parametrize(
    "row, msg",
    [
        ({"id": "a", "question": "q", "choices": ["x"], "gold": 0}, "'choices' must be a list"),
        ({"id": "a", "question": "q", "choices": ["x", "y"], "gold": 2}, "'gold' must be an index"),
        ({"id": "a", "question": "", "choices": ["x", "y"], "gold": 0}, "'question' must be"),
        ({"id": "a", "question": "q", "choices": ["x", "y"], "gold": True}, "'gold' must be"),
    ],
)
def test_a_bad_item_is_named_by_file_and_line(tmp_path, row, msg):
    p = tmp_path / "mc.jsonl"
    ok = {"id": "ok", "question": "q", "choices": ["x", "y"], "gold": 1}
    p.write_text(json.dumps(ok) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=rf"mc.jsonl:2: {msg}"):
        mcguard.load_items(p)
