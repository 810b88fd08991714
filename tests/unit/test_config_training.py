"""Config errors about training arms, caught before any job: objective vs corpus format, and a
method that cannot continue its init arm."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from arenaflow import config

REPO = Path(__file__).resolve().parents[2]


def resolved(tmp_path, edit_arm: str, text: str, cfg_edit=None):
    arms = tmp_path / "arms"
    shutil.copytree(REPO / "config/arms", arms)
    (arms / f"{edit_arm}.yaml").write_text(text)
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["arms_dir"] = str(arms)
    if cfg_edit:
        cfg_edit(cfg)
    return config.resolve(cfg, repo_root=REPO)


def test_a_dpo_arm_on_an_sft_corpus_is_refused_naming_file_and_key(tmp_path):
    with pytest.raises(
        config.ConfigError, match=r"B2\.yaml: key 'hyper/objective': 'dpo' cannot train"
    ):
        resolved(tmp_path, "B2", "init: R2d\ncorpus: rft_r3\nhyper: {objective: dpo}\n")


def test_a_dpo_arm_on_a_pairs_corpus_resolves(tmp_path):
    def pairs(cfg):
        cfg["corpora"]["pref"] = {"pool": "math_r3", "policy": "R2d", "format": "pairs"}

    cfg = resolved(
        tmp_path, "B2", "init: R2d\ncorpus: pref\nhyper: {objective: dpo, beta: 0.1}\n", pairs
    )
    assert cfg["arms"]["B2"]["hyper"]["objective"] == "dpo"


def test_a_full_arm_cannot_continue_a_lora_arm(tmp_path):
    with pytest.raises(
        config.ConfigError, match=r"B4\.yaml: key 'hyper/method': a full arm cannot continue 'R2d'"
    ):
        resolved(tmp_path, "B4", "init: R2d\ncorpus: rft_r3\nhyper: {method: full}\n")
