"""ifpool's `probe` split (arenaflow.instruct.probe): disjoint from train and eval in subjects, task
templates, constraint phrasings and constraint values, for every family; train/eval unchanged."""

from __future__ import annotations

import collections
import copy
import hashlib
import json
import re

import pytest
import yaml

from arenaflow import config
from arenaflow.config import ConfigError
from arenaflow.instruct import check as ifcheck
from arenaflow.instruct import constraints as ifconstraints
from arenaflow.instruct import domains as ifdomains
from arenaflow.instruct import pool as ifpool
from arenaflow.instruct import probe as ifprobe
from arenaflow.pools import build as pools


@pytest.fixture(scope="module")
def probe_rows():
    params = {"kind": "ifeval", "n": 600, "seed": 3, "split": "probe", "max_constraints": 3}
    return pools.build("probe", params)


def values(rows) -> dict:
    out = collections.defaultdict(set)
    for r in rows:
        for c in r["constraints"]:
            for p, v in c.items():
                if p != "type":
                    out[(c["type"], p)].update(v if isinstance(v, list) else [v])
    return out


QUOTED_LIST = r'"[^"]*"(?:(?:,\s*|\s+(?:and|or)\s+)"[^"]*")*'  # '"a", "b" and "c"'


def grams(text: str, n: int = 4) -> set:
    """Word n-grams of an instruction with its quoted values (the constraint's, not the
    phrasing's) replaced by one token."""
    words = re.findall(r"[a-z]+", re.sub(QUOTED_LIST, " value ", text).lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_probe_values_lie_outside_both_train_and_eval_for_every_family():
    _, train = ifpool.split_values("train")
    _, ev = ifpool.split_values("eval")
    _, probe = ifpool.split_values("probe")
    assert set(ifprobe.PROBE_DOMAINS) == set(ifdomains.DOMAINS)  # every family, same order
    valueless = {f for f in ifdomains.DOMAINS if not ifprobe.PROBE_DOMAINS[f]}
    assert valueless == {"no_digits", "is_upper", "is_lower", "quoted"}  # nothing to vary
    for (family, param), vals in probe.items():
        ranges = [*train.get((family, param), ()), *ev.get((family, param), ())]
        if family in ifdomains.FIXED:  # no_char: train/eval use the one fixed character
            ranges.append(ifdomains.FIXED[family][param])
        if family == "postscript":  # train/eval use the checker's default marker
            ranges.append(ifconstraints.validate({"type": "postscript"})["marker"])
        assert ranges, (family, param)
        assert set(vals).isdisjoint(ranges), (family, param)
    for key, dom in train.items():  # counts sit past an edge of the train/eval band
        if key[1] == "n":
            full = [*dom, *ev[key]]
            assert all(v < min(full) or v > max(full) for v in probe[key]), key


def test_probe_rows_use_only_probe_values_and_cover_them(probe_rows):
    _, probe = ifpool.split_values("probe")
    seen = values(probe_rows)
    for key, vals in probe.items():
        assert seen[key] == set(vals), key
    train_rows = ifpool.generate(600, 3, "train", "t", max_constraints=3)
    eval_rows = ifpool.generate(300, 3, "eval", "e", max_constraints=3)
    other = values(train_rows + eval_rows)
    for key, vals in seen.items():
        assert vals.isdisjoint(other.get(key, set())), key


def test_probe_subjects_and_tasks_are_disjoint(probe_rows):
    assert set(ifprobe.PROBE_SUBJECTS).isdisjoint(ifdomains.SUBJECTS)
    first = lambda t: t.split()[0]  # noqa: E731
    assert {first(t) for t in ifprobe.PROBE_TASKS}.isdisjoint({first(t) for t in ifdomains.TASKS})
    for r in probe_rows:
        i = int(r["source"].split(":probe_subject=")[1].split(":")[0])
        assert ifprobe.PROBE_SUBJECTS[i] in r["prompt"]
        assert not any(s in r["prompt"] for s in ifdomains.SUBJECTS)


def test_probe_phrasings_share_no_four_words_with_the_standard_ones(probe_rows):
    for r in probe_rows:
        for c in r["constraints"]:
            mine, theirs = ifprobe.describe(c), ifconstraints.describe(c)
            assert mine in r["prompt"] and theirs not in r["prompt"]
            common = grams(mine) & grams(theirs)
            assert not common, (c, common)


def test_probe_constraints_are_valid_compatible_and_checkable(probe_rows):
    assert {r["category"] for r in probe_rows} == set(ifconstraints.FAMILIES)
    for r in probe_rows:
        for c in r["constraints"]:
            assert ifconstraints.validate(c) == c
        types = [c["type"] for c in r["constraints"]]
        assert len(set(types)) == len(types)
        assert all(frozenset((a, b)) not in ifdomains.CONFLICTS for a in types for b in types)
    # a response written to a probe constraint passes the checker; one written to train's fails
    c = {"type": "postscript", "marker": "P.P.S."}
    assert ifcheck.check("Body.\nP.P.S. more", [c])["passed"]
    assert not ifcheck.check("Body.\nP.S. more", [c])["passed"]
    no_semicolon = {"type": "no_char", "chars": ";"}
    assert not ifcheck.check("a; b", [no_semicolon])["passed"]


def test_train_and_eval_draws_are_unchanged_by_the_probe():
    # digests of ifpool.generate before the probe split existed (commit a108048)
    before = {
        ("train", 1, 3, 600): "02f80a71480bbc67",
        ("train", 0, 1, 300): "bcb046237f59f7d4",
        ("eval", 1, 3, 600): "9deaab6698742781",
        ("eval", 77, 2, 200): "b7db806e9919b9f7",
    }
    for (split, seed, mc, n), digest in before.items():
        rows = ifpool.generate(n, seed, split, "p", max_constraints=mc)
        assert hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16] == digest


def test_probe_is_seeded_and_rejects_unknown_splits():
    a = ifpool.generate(50, 1, "probe", "p")
    assert a == ifpool.generate(50, 1, "probe", "p")
    assert a != ifpool.generate(50, 2, "probe", "p")
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'eval', 'probe'\)"):
        ifpool.generate(5, 0, "holdout", "p")


def test_schema_accepts_probe_for_ifeval_pools_only(repo_root):
    raw = yaml.safe_load((repo_root / "config/config.yaml").read_text())
    cfg = copy.deepcopy(raw)
    cfg["pools"]["if_probe"] = {"kind": "ifeval", "n": 10, "seed": 0, "split": "probe"}
    resolved = config.resolve(cfg, repo_root=repo_root, config_file="config/config.yaml")
    assert resolved["pools"]["if_probe"]["split"] == "probe"
    bad = copy.deepcopy(raw)
    bad["pools"]["m_probe"] = {
        "kind": "math",
        "n": 10,
        "seed": 0,
        "split": "probe",
        "categories": {"add": 1},
    }
    with pytest.raises(ConfigError, match="m_probe"):
        config.resolve(bad, repo_root=repo_root, config_file="config/config.yaml")
