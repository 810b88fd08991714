"""Mixture arms (lineage 003's `iflensyn:33000`, `tulu3:all,smoltalk:all`): an arm trains on
several corpora, all rows or a seeded sample of N from each, every source verified; the run
records rows, tokens and supervised fraction per source; errors name the arm file and key."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from arenaflow import config, io, manifest
from arenaflow.bases import tinymodel
from arenaflow.budget import ledger as afbudget
from arenaflow.config import ConfigError
from arenaflow.corpora import build as corpora
from arenaflow.pools import math as mathpool
from arenaflow.train import argv as train_argv
from arenaflow.train import data

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "models/tiny-arith"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two corpora of reference rows: a (30 rows) and b (12 rows)."""
    root = tmp_path_factory.mktemp("results") / "corpora"  # a corpus records where it belongs
    tok = tinymodel.build_tokenizer()
    for cid, n, seed in (("a", 30, 1), ("b", 12, 2)):
        rows = mathpool.generate(n, seed, "train", {"add": 1, "mul": 1}, cid)
        corpora.build(root / cid, rows, tok, tinymodel.SYSTEM_PROMPT, {})
    return root


def test_a_mixture_takes_a_seeded_sample_and_all_rows_and_counts_each_source(sources):
    mix = {"a": 10, "b": "all"}
    dirs = [sources / "a", sources / "b"]
    rows, record, stats = data.load_mixture(dirs, mix, seed=981, where="arms/m.yaml")
    assert len(rows["sft"]) == 10 + 12 and [s["rows"] for s in stats] == [10, 12]
    assert [s["rows_available"] for s in stats] == [30, 12]
    # the 10 rows of a are a's rows at the sampled indices, in corpus order
    idx = data.sample_rows(30, 10, 981, "a")
    assert len(set(idx.tolist())) == 10 and list(idx) == sorted(idx)
    a_rows = data.load_corpus(sources / "a")[0]["sft"]
    for (ids, mask), i in zip(rows["sft"][:10], idx):
        assert np.array_equal(ids, a_rows[i][0]) and np.array_equal(mask, a_rows[i][1])
    # oracle for b (all rows): the corpus build's own stats.json
    b_stats = io.read_json(sources / "b" / "stats.json")
    assert stats[1]["tokens"] == b_stats["tokens"]
    assert stats[1]["supervised_tokens"] == b_stats["supervised_tokens"]
    # oracle for a's sample: its rows re-tokenised from rows.jsonl
    picked = [io.read_jsonl(sources / "a" / "rows.jsonl")[i] for i in idx]
    _, tok_stats = corpora.tokenize(picked, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT)
    assert stats[0]["tokens"] == tok_stats["tokens"]
    assert stats[0]["supervised_tokens"] == tok_stats["supervised_tokens"]
    assert stats[0]["supervised_fraction"] == pytest.approx(
        tok_stats["supervised_tokens"] / tok_stats["tokens"], abs=1e-6
    )
    assert stats[0]["digest"] == manifest.verify(sources / "a")["digest"]
    # deterministic: the same seed the same rows and digest; another seed another sample
    again = data.load_mixture(dirs, mix, seed=981, where="x")
    assert again[1]["digest"] == record["digest"]
    other = data.load_mixture(dirs, mix, seed=982, where="x")
    assert other[1]["digest"] != record["digest"]
    assert not np.array_equal(data.sample_rows(30, 10, 982, "a"), idx)


def test_a_count_larger_than_the_corpus_names_the_arm_file_and_key(sources):
    with pytest.raises(SystemExit, match=r"arms/m\.yaml: key 'corpus/b': 13 rows asked.*only 12"):
        data.load_mixture(
            [sources / "a", sources / "b"], {"a": 5, "b": 13}, seed=0, where="arms/m.yaml"
        )


def test_a_tampered_source_is_refused(sources, tmp_path):
    bad = tmp_path / "b"
    shutil.copytree(sources / "b", bad)
    with open(bad / "rows.jsonl", "a") as f:
        f.write("\n")
    with pytest.raises(manifest.ManifestError):
        data.load_mixture([sources / "a", bad], {"a": 5, "b": "all"}, seed=0, where="m")


# ---- config -----------------------------------------------------------------------------
@pytest.fixture
def cfg_arms(tmp_path):
    arms = tmp_path / "arms"
    shutil.copytree(REPO / "config/arms", arms)
    raw = yaml.safe_load((REPO / "config/config.yaml").read_text())
    raw["arms_dir"] = str(arms)
    return raw, arms


def write_arm(arms: Path, name: str, corpus) -> Path:
    path = arms / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"init": "R2d", "corpus": corpus}, sort_keys=False))
    return path


def test_a_mixture_arm_resolves_with_each_sources_policy_in_its_lineage(cfg_arms):
    raw, arms = cfg_arms
    write_arm(arms, "M", {"rft_r3": 50, "sft_s1": "all"})
    cfg = config.resolve(copy.deepcopy(raw))
    m = cfg["arms"]["M"]
    assert m["mix"] == {"rft_r3": 50, "sft_s1": "all"} and list(m["mix"]) == ["rft_r3", "sft_s1"]
    assert m["corpus"] == "rft_r3:50,sft_s1:all"
    assert m["lineage"][0] == "R2d" and "S1" in m["lineage"]  # rft_r3's policy is R2d
    # the budget counts 50 rows of rft_r3 (a 400-prompt pool) and all 400 of sft_s1
    b = afbudget.Budget(cfg, results=Path(raw["arms_dir"]).parent / "results")
    assert b.estimate("M").rows == 50 + 400
    assert set(b.estimate("M").sampled()) == {"rft_r3"}  # sft_s1 is reference rows: no sampling


@pytest.mark.parametrize(
    "corpus,key,message",
    [
        ({"rft_r3": 10, "rft_r9": "all"}, "corpus/rft_r9", "unknown corpus 'rft_r9'"),
        ({"rft_r3": 401}, "corpus/rft_r3", "401 rows asked.*at most 400"),
        ({"rft_r3": 0}, "corpus/rft_r3", "less than the minimum of 1"),
        ({"rft_r3": "some"}, "corpus/rft_r3", "'all' was expected"),
        ({"rft_r3": 2.5}, "corpus/rft_r3", "not of type 'integer'"),
    ],
)
def test_a_bad_mixture_names_the_arm_file_and_key(cfg_arms, corpus, key, message):
    raw, arms = cfg_arms
    path = write_arm(arms, "M", corpus)
    with pytest.raises(ConfigError, match=message) as e:
        config.resolve(copy.deepcopy(raw))
    assert str(path) in str(e.value) and f"'{key}'" in str(e.value)


# ---- a training run on a mixture ---------------------------------------------------------
def test_a_run_on_a_mixture_records_each_source_in_its_evidence(sources, tmp_path):
    hyper = {
        "method": "full",
        "packing": True,
        "lr": 1e-4,
        "weight_decay": 0.1,
        "warmup_ratio": 0.0,
        "min_lr_ratio": 0.08,
        "max_grad_norm": 1.0,
        "micro_batch_size": 2,
        "grad_accum": 1,
        "seq_len": 256,
        "seed": 981,
        "max_steps": 1,
    }
    mix = {"b": "all", "a": 7}
    out = tmp_path / "runs/M/final"
    cmd = train_argv(
        "M",
        hyper,
        [sources / "b", sources / "a"],
        BASE,
        out,
        extra=[
            *("--corpus-id", config.corpus_label(mix), "--mix-json", json.dumps(mix)),
            *("--arm-file", "arms/M.yaml"),
        ],
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ev = io.read_json(out / "training_evidence.json")
    assert ev["corpus"] == "b:all,a:7" and ev["mixture_seed"] == 981
    assert [(s["corpus"], s["rows"]) for s in ev["mixture"]] == [("b", 12), ("a", 7)]
    assert ev["mixture"][0]["tokens"] == io.read_json(sources / "b/stats.json")["tokens"]
    expect = data.load_mixture([sources / "b", sources / "a"], mix, 981, "x")[1]["digest"]
    assert ev["dataset_sha256"] == expect
    # a count over the corpus fails the job naming the arm file and key, before any training
    bad = [*cmd[:-1], str(tmp_path / "runs/N/final")]
    bad[bad.index("--mix-json") + 1] = json.dumps({"b": "all", "a": 31})
    proc = subprocess.run(bad, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode != 0 and "arms/M.yaml: key 'corpus/a': 31 rows asked" in proc.stderr
    assert not (tmp_path / "runs/N/final").exists()


def test_a_bundle_recomputes_the_mixture_digest_and_refuses_a_changed_source(sources, tmp_path):
    from arenaflow.bundles import checks
    from arenaflow.bundles.sources import evidence_corpora

    mix = {"a": 10, "b": "all"}
    _, record, stats = data.load_mixture([sources / "a", sources / "b"], mix, 981, "m")
    assert [s["asked"] for s in stats] == [10, "all"]
    ev = {"mixture": stats, "mixture_seed": 981, "dataset_sha256": record["digest"]}
    assert checks._check_mixture(ev, sources) == record["digest"]
    assert evidence_corpora(ev) == ["a", "b"]
    # the same evidence against a corpus b rebuilt with other rows: refused, naming the source
    other = tmp_path / "corpora"
    shutil.copytree(sources / "a", other / "a")
    rows = mathpool.generate(12, 9, "train", {"add": 1, "mul": 1}, "b")
    corpora.build(other / "b", rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {})
    with pytest.raises(checks.BundleCheckError, match="mixture source b was digest"):
        checks._check_mixture(ev, other)
