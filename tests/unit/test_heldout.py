"""Training-time held-out loss: the held-out rows are never trained on, and the loss recorded
after the last step equals an independent forward pass with the final weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from arenaflow import models
from arenaflow.pools import math as mathpool
from arenaflow.train import data, heldout


def rows(n):
    return [(np.arange(i, i + 3), np.array([0, 1, 1])) for i in range(n)]


def test_split_is_seeded_disjoint_and_covers_the_corpus():
    r = rows(20)
    train, held, idx = heldout.split(r, 5, seed=3)
    assert len(idx) == 5 and idx == sorted(idx)
    assert [h[0][0] for h in held] == idx
    assert {t[0][0] for t in train}.isdisjoint(idx)
    assert sorted([t[0][0] for t in train] + idx) == list(range(20))
    assert heldout.split(r, 5, seed=3)[2] == idx  # the same arm holds out the same rows
    assert heldout.split(r, 5, seed=4)[2] != idx
    with pytest.raises(SystemExit, match="heldout_rows 20 leaves nothing to train on"):
        heldout.split(r, 20, seed=3)


@pytest.mark.parametrize("n, world, batch", [(7, 2, 2), (150, 4, 16), (3, 4, 1), (8, 1, 3)])
def test_every_rank_runs_as_many_forwards_and_every_row_is_counted_once(n, world, batch):
    shares = [heldout._shares(n, world, rank, batch) for rank in range(world)]
    assert len({len(s) for s in shares}) == 1
    seen = sorted(i for s in shares for b in s if b for i in b)
    assert seen == list(range(n))


@pytest.fixture(scope="module")
def run(tmp_path_factory, repo_root, train_arm):
    root = tmp_path_factory.mktemp("heldout")
    corpus_rows = mathpool.generate(12, 5, "train", {"add": 1, "mul": 1}, "t")
    train_arm(
        root,
        repo_root / "models/tiny-arith",
        corpus_rows,
        "",
        max_steps=None,
        heldout_rows=4,
        heldout_every=1,
        zero3_persistence_threshold=0,
    )
    return root


def test_the_run_never_feeds_a_held_out_row(run):
    ev = json.loads((run / "runs/A/final/training_evidence.json").read_text())
    corpus, _ = data.load_corpus(run / "corpora/c")
    train, held, idx = heldout.split(corpus["sft"], 4, ev["hyperparameters"]["seed"])
    assert ev["heldout"]["row_indices"] == idx and ev["heldout"]["rows"] == 4
    # 8 training rows, 2 per step: 4 steps over exactly the training rows' tokens
    assert ev["optimizer_steps"] == 4
    assert ev["tokens_seen"] == sum(len(ids) for ids, _ in train)
    assert ev["tokens_seen"] != sum(len(ids) for ids, _ in corpus["sft"][:8])
    metrics = [json.loads(x) for x in (run / "runs/A/final/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "heldout_loss" in m] == [1, 2, 3, 4]
    assert [c["loss"] for c in ev["heldout"]["curve"]] == [m["heldout_loss"] for m in metrics]
    assert ev["heldout"]["curve"][0]["loss"] != ev["heldout"]["curve"][-1]["loss"]


def test_the_final_held_out_loss_equals_a_forward_pass_with_the_final_weights(run, repo_root):
    ev = json.loads((run / "runs/A/final/training_evidence.json").read_text())
    corpus, _ = data.load_corpus(run / "corpora/c")
    model, _ = models.load_policy(repo_root / "models/tiny-arith", run / "runs/A/final")
    total, count = 0.0, 0
    with torch.no_grad():
        for i in ev["heldout"]["row_indices"]:
            ids, mask = corpus["sft"][i]
            x = torch.as_tensor(ids, dtype=torch.long)[None]
            logits = model(input_ids=x).logits[0, :-1].float()
            target = torch.as_tensor(ids[1:], dtype=torch.long)
            keep = torch.as_tensor(mask[1:]) == 1
            total += float(F.cross_entropy(logits[keep], target[keep], reduction="sum"))
            count += int(keep.sum())
    assert ev["heldout"]["supervised_tokens"] == count
    assert ev["heldout"]["final_loss"] == pytest.approx(total / count, rel=1e-5)


def independent_loss(repo_root, run_dir, corpus_dir, indices):
    """Mean token NLL of the corpus rows `indices` under the merged final weights."""
    corpus, _ = data.load_corpus(corpus_dir)
    model, _ = models.load_policy(repo_root / "models/tiny-arith", run_dir)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in indices:
            ids, mask = corpus["sft"][i]
            logits = model(input_ids=torch.as_tensor(ids, dtype=torch.long)[None]).logits
            keep = torch.as_tensor(mask[1:]) == 1
            target = torch.as_tensor(ids[1:], dtype=torch.long)[keep]
            total += float(F.cross_entropy(logits[0, :-1].float()[keep], target, reduction="sum"))
            count += int(keep.sum())
    return total / count


@pytest.mark.ranks  # two gloo ranks: the ranks tier keeps the README's default tier short
def test_two_ranks_with_uneven_shares_stay_in_step_and_record_the_true_loss(
    tmp_path, repo_root, train_arm
):
    # 3 held-out rows, one per micro-batch: rank 0 evaluates rows 0 and 2, rank 1 row 1 and
    # then a filler forward (ZeRO-3 gathers each layer collectively: a rank that skipped it
    # would hang the other)
    train_arm(
        tmp_path,
        repo_root / "models/tiny-arith",
        mathpool.generate(11, 6, "train", {"add": 1}, "t"),
        "",
        nproc=2,
        max_steps=None,
        micro_batch_size=1,
        heldout_rows=3,
        heldout_every=2,
        zero3_persistence_threshold=0,
    )
    out, corpus = tmp_path / "runs/A/final", tmp_path / "corpora/c"
    ev = json.loads((out / "training_evidence.json").read_text())
    assert ev["world_size"] == 2 and ev["optimizer_steps"] == 4
    assert [c["step"] for c in ev["heldout"]["curve"]] == [2, 4]
    want = independent_loss(repo_root, out, corpus, ev["heldout"]["row_indices"])
    assert ev["heldout"]["final_loss"] == pytest.approx(want, rel=1e-5)


def test_config_refuses_held_out_rows_for_a_preference_arm(repo_root, tmp_path):
    import copy
    import shutil

    import yaml

    from arenaflow import config

    raw = yaml.safe_load((repo_root / "config/config.yaml").read_text())
    arms = tmp_path / "arms"
    shutil.copytree(repo_root / "config/arms", arms)
    cfg = copy.deepcopy(raw)
    cfg["arms_dir"] = str(arms)
    cfg["corpora"]["pref"] = {"pool": "math_r1", "policy": "S1", "format": "pairs"}
    (arms / "P.yaml").write_text(
        yaml.safe_dump(
            {"init": "S1", "corpus": "pref", "hyper": {"objective": "simpo", "heldout_rows": 10}}
        )
    )
    with pytest.raises(config.ConfigError, match=r"P.yaml: key 'hyper/heldout_rows'.*'simpo'"):
        config.resolve(cfg, repo_root=repo_root, config_file="c.yaml")
