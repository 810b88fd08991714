"""System-prompt search: the table and pairs (exact McNemar against scipy), the chosen prompt,
the config's search regimes, the readout rule's system turn, and the bundle serving the choice."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from scipy.stats import binomtest

from arenaflow import config, manifest
from arenaflow.bundles import build as bundles
from arenaflow.bundles.checks import BundleCheckError
from arenaflow.evals import promptsearch, readout_file, readout_rows

# 8 items; k0 right on 6, k1 on 6 (other items), none on 2
OUTCOMES = {
    "none": [1, 1, 0, 0, 0, 0, 0, 0],
    "k0": [1, 1, 1, 1, 1, 1, 0, 0],
    "k1": [0, 1, 1, 1, 1, 1, 1, 0],
}


def frame(key, correct):
    n = len(correct)
    return pd.DataFrame(
        {
            "arm": "A",
            "item_id": [f"i{j}" for j in range(n)],
            "replicate": 0,
            "category": "c",
            "prompt_sha256": [f"{key}-p{j}" for j in range(n)],  # the system turn differs
            "target_sha256": [f"t{j}" for j in range(n)],
            "correct": [bool(c) for c in correct],
        }
    )


def test_table_pairs_and_choice_match_hand_counts():
    res = promptsearch.search({k: frame(k, v) for k, v in OUTCOMES.items()}, ["k0", "k1"])
    t = {r["prompt"]: r for r in res["table"]}
    assert [r["prompt"] for r in res["table"]] == ["none", "k0", "k1"]
    assert (t["k0"]["correct"], t["k1"]["correct"], t["none"]["correct"]) == (6, 6, 2)
    assert (t["k0"]["vs_none"]["wins"], t["k0"]["vs_none"]["losses"]) == (4, 0)
    assert (t["k1"]["vs_none"]["wins"], t["k1"]["vs_none"]["losses"]) == (5, 1)
    assert t["k1"]["vs_none"]["p_value"] == pytest.approx(binomtest(5, 6, 0.5).pvalue)
    (pair,) = res["pairs"]
    assert (pair["a"], pair["b"], pair["wins"], pair["losses"]) == ("k0", "k1", 1, 1)
    assert pair["p_value"] == 1.0
    assert res["chosen"] == "k0"  # a tie on correct goes to the first in config order


def test_no_prompt_is_chosen_when_every_candidate_reads_worse_or_equal():
    out = {"none": [1, 1, 1, 0], "k0": [1, 1, 0, 0], "k1": [0, 1, 1, 1]}
    res = promptsearch.search({k: frame(k, v) for k, v in out.items()}, ["k0", "k1"])
    assert res["chosen"] == "none"  # k1 ties none at 3: no prompt without evidence for one


def test_items_read_under_one_prompt_only_or_other_targets_are_refused():
    short = frame("k1", OUTCOMES["k1"]).iloc[:-1]
    with pytest.raises(ValueError, match=r"k1 vs none: item 'i7' is read out under one prompt"):
        promptsearch.search(
            {
                "none": frame("none", OUTCOMES["none"]),
                "k0": frame("k0", OUTCOMES["k0"]),
                "k1": short,
            },
            ["k0", "k1"],
        )
    other = frame("k0", OUTCOMES["k0"]).assign(target_sha256="x")
    with pytest.raises(ValueError, match="k0 vs none: item 'i0' has different targets"):
        promptsearch.search({"none": frame("none", OUTCOMES["none"]), "k0": other}, ["k0"])


def test_cli_writes_a_sealed_search_that_a_bundle_serves(tmp_path):
    paths, args = {}, []
    for k, v in OUTCOMES.items():
        paths[k] = str(tmp_path / f"{k}.parquet")
        readout_file.write_readout(
            readout_rows.structure(frame(k, v).assign(completion="x", n_tokens=1, stopped=True)),
            paths[k],
            {},
        )
        args += ["--readouts", f"{k}={paths[k]}"]
    prompts = {"none": "", "k0": "Be exact.", "k1": "Count words."}
    out = tmp_path / "prompt_search" / "S.json"
    promptsearch.main(
        [
            "--search",
            "S",
            "--arm",
            "A",
            *args,
            "--prompts-json",
            json.dumps(prompts),
            "--out",
            str(out),
        ]
    )
    rec = manifest.check_seal(json.loads(out.read_text()), out)
    assert (rec["chosen"], rec["chosen_text"]) == ("k0", "Be exact.")
    cfg = {"system_prompt": {"search": "S"}}
    check = bundles.chosen_prompt(SimpleNamespace(prompt_search=str(out)), cfg)
    assert cfg["system_prompt"] == "Be exact." and "'k0'" in check["detail"]
    with pytest.raises(BundleCheckError, match="prompt search 'S', not 'T'"):
        bundles.chosen_prompt(
            SimpleNamespace(prompt_search=str(out)), {"system_prompt": {"search": "T"}}
        )
    edited = {**rec, "chosen_text": "Something else."}
    out.write_text(json.dumps(edited))
    with pytest.raises(manifest.ManifestError):
        bundles.chosen_prompt(
            SimpleNamespace(prompt_search=str(out)), {"system_prompt": {"search": "S"}}
        )


@pytest.fixture
def raw(repo_root):
    return yaml.safe_load((repo_root / "config/config.yaml").read_text())


def with_search(raw):
    cfg = copy.deepcopy(raw)
    cfg["evals"]["math"]["system_prompts"] = {"k0": "Be exact.", "k1": "Count."}
    cfg["prompt_search"] = {"S": {"suite": "math", "regime": "greedy", "arm": "B3"}}
    return cfg


def test_config_gives_each_regime_search_regimes_under_each_prompt(raw, repo_root):
    res = config.resolve(with_search(raw), repo_root=repo_root, config_file="c.yaml")
    s = res["evals"]["math"]
    assert set(s["prompt_regimes"]) == {
        f"{r}-{k}" for r in s["regimes"] for k in ("none", "k0", "k1")
    }
    assert config.system_prompt_of(res, "math", "greedy-k1") == "Count."
    assert config.system_prompt_of(res, "math", "greedy-none") == ""
    assert config.system_prompt_of(res, "math", "greedy") == res["system_prompt"]
    assert (
        config.regime(res, "math", "greedy-k0")["replicates"]
        == s["regimes"]["greedy"]["replicates"]
    )


@pytest.mark.parametrize(
    "edit, msg",
    [
        (lambda c: c["evals"]["math"]["system_prompts"].update(none="x"), "'none' is reserved"),
        (lambda c: c["prompt_search"]["S"].update(arm="nope"), r"prompt_search/S/arm'"),
        (lambda c: c["prompt_search"]["S"].update(regime="nope"), r"prompt_search/S/regime'"),
        (
            lambda c: c["bundles"]["B3f"].update(system_prompt={"search": "T"}),
            r"bundles/B3f/system_prompt/search': unknown prompt search 'T'",
        ),
    ],
)
def test_config_errors_name_the_key(raw, repo_root, edit, msg):
    cfg = with_search(raw)
    edit(cfg)
    with pytest.raises(config.ConfigError, match=msg):
        config.resolve(cfg, repo_root=repo_root, config_file="c.yaml")
