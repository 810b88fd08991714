"""Merge and dose arms in the config: resolved with their weights and lineage, and every bad
one refused before any job, naming the file and key."""

from __future__ import annotations

import shutil

import pytest
import yaml

from arenaflow import config
from arenaflow.config import ConfigError

CONFIG_FILE = "config/config.yaml"


@pytest.fixture
def arms(tmp_path, repo_root):
    d = tmp_path / "arms"
    shutil.copytree(repo_root / "config" / "arms", d)
    return d


def resolve(arms, repo_root, **arm_files):
    cfg = yaml.safe_load((repo_root / CONFIG_FILE).read_text())
    cfg["arms_dir"] = str(arms)
    for name, data in arm_files.items():
        (arms / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return config.resolve(cfg, repo_root=repo_root, config_file=CONFIG_FILE)


def refused(arms, repo_root, name, data, key):
    with pytest.raises(ConfigError) as e:
        resolve(arms, repo_root, **{name: data})
    msg = str(e.value)
    assert str(arms / f"{name}.yaml") in msg and key in msg, msg
    return msg


def test_shipped_soup_and_dose_line_resolve_to_weights_and_lineage(arms, repo_root):
    a = resolve(arms, repo_root)["arms"]
    assert a["soup"]["merge"]["weights"] == {"B3": 0.5, "B2": 0.5}
    assert a["soup"]["init"] == "B3" and a["soup"]["hyper"]["method"] == "lora"
    # x = R2d + alpha (B3 - R2d) = (1 - alpha) R2d + alpha B3, one arm per alpha
    for arm, alpha in (("dose-a0p5", 0.5), ("dose-a1p5", 1.5), ("dose-a2", 2.0)):
        assert a[arm]["merge"]["weights"] == {"R2d": pytest.approx(1 - alpha), "B3": alpha}
        assert a[arm]["dose"] == {"from": "R2d", "to": "B3", "alpha": alpha}
        assert a[arm]["init"] == "R2d" and a[arm]["corpus"] is None
        assert set(a[arm]["lineage"]) == {"R2d", "B3", "R220", "S1"}
    assert set(a["soup"]["lineage"]) == {"B3", "B2", "R2d", "R220", "S1"}


def test_alpha_ids_are_readable_and_an_end_of_the_line_drops_its_zero_weight(arms, repo_root):
    a = resolve(
        arms, repo_root, line={"dose": {"from": "base", "to": "B3", "alpha": [-0.5, 1, 0.25]}}
    )["arms"]
    assert {"line-am0p5", "line-a1", "line-a0p25"} <= set(a)
    assert a["line-a1"]["merge"]["weights"] == {"B3": 1.0}  # base adds nothing
    assert a["line-am0p5"]["merge"]["weights"] == {"B3": -0.5}


def test_a_trained_arm_may_continue_a_merge(arms, repo_root):
    a = resolve(arms, repo_root, B5={"init": "soup", "corpus": "rft_r3"})["arms"]
    assert a["B5"]["lineage"][0] == "soup" and "B2" in a["B5"]["lineage"]


def test_unknown_arm_in_a_merge_names_the_key(arms, repo_root):
    msg = refused(arms, repo_root, "soup", {"merge": {"of": {"B3": 0.5, "B9": 0.5}}}, "merge/of/B9")
    assert "'B9'" in msg


def test_unknown_dose_end_names_the_key(arms, repo_root):
    refused(
        arms, repo_root, "dose", {"dose": {"from": "R2x", "to": "B3", "alpha": 0.5}}, "dose/from"
    )


@pytest.mark.parametrize(
    "of, key", [({"B3": "half"}, "merge/of/B3"), ({"B3": None}, "merge/of/B3"), ({}, "merge/of")]
)
def test_weights_must_be_numbers(arms, repo_root, of, key):
    refused(arms, repo_root, "soup", {"merge": {"of": of}}, key)


def test_non_finite_weight_is_refused(arms, repo_root):
    (arms / "soup.yaml").write_text("merge:\n  of: {B3: .nan, B2: 0.5}\n")
    with pytest.raises(ConfigError, match="not a finite number") as e:
        resolve(arms, repo_root)
    assert "merge/of/B3" in str(e.value)


def test_nothing_to_merge_is_refused(arms, repo_root):
    refused(arms, repo_root, "soup", {"merge": {"of": {"B3": 0, "base": 1.0}}}, "merge")


def test_a_dose_from_an_arm_to_itself_is_refused(arms, repo_root):
    refused(arms, repo_root, "dose", {"dose": {"from": "B3", "to": "B3", "alpha": 2}}, "dose/to")


def test_a_file_of_two_kinds_is_refused(arms, repo_root):
    msg = refused(
        arms,
        repo_root,
        "soup",
        {"init": "R2d", "corpus": "rft_r3", "merge": {"of": {"B3": 1}}},
        "exactly one of",
    )
    assert "merge" in msg and "trained" in msg


def test_a_merge_cycle_names_the_file_and_key_closing_it(arms, repo_root):
    # soup merges B3; make B3 continue the soup
    (arms / "B3.yaml").write_text(yaml.safe_dump({"init": "soup", "corpus": "rft_r3"}))
    with pytest.raises(ConfigError, match="lineage cycle") as e:
        resolve(arms, repo_root)
    assert "soup -> B3 -> soup" in str(e.value) or "B3 -> soup -> B3" in str(e.value)


def test_merging_a_full_arm_with_a_lora_arm_is_refused(arms, repo_root):
    full = {"init": "base", "corpus": "sft_s1", "hyper": {"method": "full"}}
    (arms / "F1.yaml").write_text(yaml.safe_dump(full))
    msg = refused(
        arms, repo_root, "soup", {"merge": {"of": {"B3": 0.5, "F1": 0.5}}}, "different methods"
    )
    assert "F1 is full" in msg and "B3 is lora" in msg


def test_dose_ids_colliding_with_another_arm_are_refused(arms, repo_root):
    shutil.copy(arms / "B1.yaml", arms / "dose-a2.yaml")
    with pytest.raises(ConfigError, match="dose-a2") as e:
        resolve(arms, repo_root)
    assert "dose" in str(e.value)
