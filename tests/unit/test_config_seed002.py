"""config/seeds/002.yaml: lineage 002 as a standalone config. It resolves alone and with its
GPU sizes (config/config.yaml's math lineage never leaks in), its arms are the card's stages,
and its bar is the card's promotion rule; a band read twice is refused before any job runs."""

from __future__ import annotations

import pytest
import yaml

from arenaflow import config as afconfig
from arenaflow import schema as afschema

REPO = afschema.REPO_ROOT
TOY = [REPO / "config/seeds/002.yaml"]
GPU = [*TOY, REPO / "config/seeds/002-gpu.yaml"]


def resolved(files, base=None):
    raw, sources = afconfig.load_configs(files)
    if base:  # the GPU model is imported on the GPU host (arenaflow.bases.hfimport), not shipped
        raw["base"]["path"] = base
    return afconfig.resolve(raw, config_file=" + ".join(map(str, files)), sources=sources)


@pytest.fixture(scope="module")
def toy():
    return resolved(TOY)


def test_it_stands_alone(toy):
    assert not {"math_eval", "sft_s1"} & set(toy["pools"]) and "continual" not in toy
    assert toy["arms_dir"] == "config/seeds/002/arms"


def test_the_stages_chain_as_the_card_did(toy):
    arms = toy["arms"]
    assert (arms["S1"]["init"], arms["S2"]["init"]) == ("base", "S1")
    bands = [toy["pools"][toy["corpora"][arms[a]["corpus"]]["pool"]]["band"] for a in ("S1", "S2")]
    assert bands == [{"index": 0, "of": 2}, {"index": 1, "of": 2}]
    dpo = {a: v["hyper"] for a, v in arms.items() if a.startswith("D-")}
    assert {(h["beta"], h["lr"]) for h in dpo.values()} == {
        (b, lr) for b in (0.1, 0.5) for lr in (5e-4, 2e-3)
    }
    assert all(h["objective"] == "dpo" and h["nll_weight"] > 0 for h in dpo.values())
    assert toy["corpora"]["pref"]["format"] == "pairs"
    assert (
        arms["R3"]["init"] == "dpo-nominee" and toy["corpora"]["repair"]["policy"] == "dpo-nominee"
    )
    assert (arms["SD"]["init"], toy["corpora"]["mix_x1"]["policy"]) == ("R3", "R3")
    grid = {a: (v["init"], v["corpus"]) for a, v in arms.items() if a.startswith("N-")}
    assert grid == {
        "N-nom-x1": ("r6-nominee", "mix_x1"),
        "N-nom-x2": ("r6-nominee", "mix_x2"),
        "N-par-x1": ("R3", "mix_x1"),
        "N-par-x2": ("R3", "mix_x2"),
    }
    # the doubled mix at SD's steps: twice the prompts, half the epochs
    pools = toy["pools"]
    assert pools["if_r6x2"]["n"] == 2 * pools["if_r6"]["n"]
    assert [arms[a]["hyper"]["epochs"] for a in ("SD", "N-nom-x1", "N-nom-x2")] == [2, 2, 1]


def test_r6_and_r7_judge_by_the_cards_rule(toy):
    for rnd in ("r6", "r7"):
        bar = toy["rounds"][rnd]["bar"]
        assert [(c.get("suite", "h6"), c["metric"], c["op"]) for c in bar] == [
            ("h6", "delta", ">"),
            ("h6", "family_delta_min", ">="),
            ("probe", "delta", ">="),
        ]
    assert toy["rounds"]["r7"]["incumbent"] == "r6-nominee"


def test_the_gpu_sizes_keep_the_lineage(toy):
    raw, _ = afconfig.load_configs(GPU)
    assert raw["base"]["path"] == "models/smollm2-135m-instruct"
    gpu = resolved(GPU, base="models/tiny-ifchat")
    assert gpu["arms"].keys() == toy["arms"].keys()
    assert (gpu["pools"]["h6"]["n"], gpu["pools"]["probe2"]["n"]) == (1600, 300)  # the card's


def test_two_pools_reading_one_band_are_refused_before_any_job(tmp_path):
    cfg = yaml.safe_load((REPO / "config/seeds/002.yaml").read_text())
    cfg["pools"]["chat_e1"]["band"]["index"] = 0
    with pytest.raises(afconfig.ConfigError, match="pools/chat_e1/band/index': pool 'chat_e0'"):
        afconfig.resolve(cfg, config_file="002.yaml")
