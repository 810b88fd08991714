"""arenaflow.rounds.continual: round templates and nominee references resolve before any job, every
template typo is refused naming the key, a round that keeps its incumbent hands the incumbent's
weights to the next round, and the stop rules."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from arenaflow import config, io, manifest
from arenaflow.config import ConfigError
from arenaflow.rounds import continual, nominate

CONFIG_FILE = "config/config.yaml"


@pytest.fixture
def cfg(repo_root):
    return yaml.safe_load((repo_root / CONFIG_FILE).read_text())


def resolve(cfg, repo_root):
    return config.resolve(copy.deepcopy(cfg), repo_root=repo_root, config_file=CONFIG_FILE)


def test_the_template_makes_each_round_continue_the_last_ones_nominee(cfg, repo_root):
    res = resolve(cfg, repo_root)
    r4, r5 = res["rounds"]["r4"], res["rounds"]["r5"]
    assert (r4["incumbent"], r5["incumbent"]) == ("r3-nominee", "r4-nominee")
    assert r4["candidates"] == ["r4-hi", "r4-lo"] and r4["bar"] == res["rounds"]["r3"]["bar"]
    assert (
        res["corpora"]["r5-corpus"]["policy"] == "r4-nominee"
        and res["corpora"]["r5-corpus"]["pool"] == "r5-pool"
    )
    assert (
        res["arms"]["r5-lo"]["init"] == "r4-nominee"
        and res["arms"]["r5-lo"]["hyper"]["lr"] == 5.0e-4
    )
    # a fresh slice each round: another seed, and no prompt of any earlier training pool
    assert (res["pools"]["r4-pool"]["seed"], res["pools"]["r5-pool"]["seed"]) == (41, 42)
    assert res["pools"]["r5-pool"]["exclude"] == [
        "math_r1",
        "math_r2",
        "math_r3",
        "sft_s1",
        "r4-pool",
    ]
    # the nominee is one of the round's arms, so its lineage holds them all until the round is
    # judged
    nominee = res["arms"]["r3-nominee"]
    assert nominee["kind"] == "nominee" and set(nominee["parents"]) == {
        "R2d",
        *res["rounds"]["r3"]["candidates"],
    }
    assert (
        "r3-nominee" in res["arms"]["r4-lo"]["lineage"] and "B3" in res["arms"]["r4-lo"]["lineage"]
    )


def test_a_nominee_reference_may_name_any_round_by_hand(cfg, repo_root, tmp_path):
    arms = tmp_path / "arms"
    shutil.copytree(repo_root / "config/arms", arms)
    (arms / "C1.yaml").write_text("init: {nominee: r3}\ncorpus: rft_c1\n")
    cfg["arms_dir"] = str(arms)
    cfg["corpora"]["rft_c1"] = {"pool": "math_r3", "policy": {"nominee": "r3"}}
    res = resolve(cfg, repo_root)
    assert (
        res["arms"]["C1"]["init"] == "r3-nominee"
        and res["corpora"]["rft_c1"]["policy"] == "r3-nominee"
    )


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda c: c["continual"].__setitem__("afer", "r3"), "continual"),  # a typo'd key
        (lambda c: c["continual"].__setitem__("after", "r9"), "continual/after"),  # no such round
        (lambda c: c["continual"].__setitem__("rounds", 0), "continual/rounds"),
        (lambda c: c["continual"]["pool"].__setitem__("n", "many"), "continual/pool/n"),
        (lambda c: c["continual"].__setitem__("stop", {"after_kept": 2}), "continual/stop"),
        (
            lambda c: c["corpora"]["rft_r3"].__setitem__("policy", {"nominee": "r9"}),
            "corpora/rft_r3/policy",
        ),
        (
            lambda c: c["corpora"]["rft_r3"].__setitem__("policy", {"nomine": "r2"}),
            "corpora/rft_r3/policy",
        ),
        (
            lambda c: c["rounds"].__setitem__("r4", copy.deepcopy(c["rounds"]["r3"])),
            "continual",
        ),  # r4 taken
    ],
)
def test_a_template_typo_fails_before_any_job_naming_the_key(cfg, repo_root, edit, key):
    edit(cfg)
    with pytest.raises(ConfigError) as e:
        resolve(cfg, repo_root)
    assert f"key '{key}" in str(e.value), str(e.value)


def test_a_template_arm_may_not_set_its_own_init(cfg, repo_root, tmp_path):
    grid = tmp_path / "grid"
    grid.mkdir()
    (grid / "x.yaml").write_text("init: base\nhyper: {lr: 1.0e-3}\n")
    cfg["continual"]["arms_dir"] = str(grid)
    with pytest.raises(ConfigError, match="key 'init': a round template's arm sets only") as e:
        resolve(cfg, repo_root)
    assert str(grid / "x.yaml") in str(e.value)


def test_a_round_id_without_a_number_cannot_be_continued(cfg, repo_root):
    cfg["rounds"]["final"] = cfg["rounds"].pop("r3")
    cfg["bundles"]["B3f"]["round"] = "final"
    cfg["continual"]["after"] = "final"
    with pytest.raises(ConfigError, match="does not end in a number"):
        resolve(cfg, repo_root)


# ---- stop rules ---------------------------------------------------------------------------------
ROUNDS = ["r4", "r5", "r6", "r7"]


def test_stop_after_m_rounds_in_a_row_that_kept_their_incumbent():
    never = lambda r: None  # noqa: E731
    stop = {"after_kept_rounds": 2}
    assert continual.stop_reason(ROUNDS, 2, [True, False], stop, never) is None
    assert "r5, r6" in continual.stop_reason(ROUNDS, 3, [False, True, True], stop, never)
    assert (
        continual.stop_reason(ROUNDS, 3, [True, True, True], {}, never) is None
    )  # no rule, no stop


def test_the_budget_stops_a_round_it_cannot_pay_for():
    over = {"r6": "stopped: round r6 needs 9.0 GPU-minutes, 4.0 are left of the budget"}
    assert continual.stop_reason(ROUNDS, 2, [False, False], {}, over.get) == over["r6"]
    st = continual.status(ROUNDS, "r7", [], {}, over["r6"])
    assert st["stopped"] == over["r6"] and st["rounds"] == []


# ---- the nominee's run ---------------------------------------------------------------------------
def run_dir(root, arm, payload: bytes):
    d = root / "runs" / arm / "final"
    d.mkdir(parents=True)
    (d / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (d / "adapter_model.safetensors").write_bytes(payload)
    (d / "training_evidence.json").write_text(json.dumps({"arm": arm, "init": "base"}))
    manifest.write(d)
    return d


def sealed_nomination(root, promoted_by_bar: bool):
    """r3 judged B3 against R2d; B3 clears the bar or not."""
    compare = root / "compare.json"
    compare.write_text("{}")
    verdict = {
        "arm": "B3",
        "delta": 1.0 if promoted_by_bar else -1.0,
        "clears": promoted_by_bar,
        "accuracy": 50.0,
        "ref_accuracy": 49.0,
        "wins": 3,
        "losses": 2,
        "p_value": 1.0,
        "clauses": [],
    }
    rec = {
        "round": "r3",
        "incumbent": "R2d",
        "candidates": [verdict],
        "promoted": "B3" if promoted_by_bar else "R2d",
    }
    path = root / "nominations/r3.json"
    path.parent.mkdir(parents=True)
    io.write_json(path, nominate.seal(rec, ["compare.json"]))
    return path


@pytest.mark.parametrize("clears", [False, True], ids=["kept", "promoted"])
def test_the_next_round_continues_the_incumbent_when_nobody_is_promoted(
    tmp_path, monkeypatch, clears
):
    monkeypatch.chdir(tmp_path)  # a nomination names its judged files relative to the results dir
    run_dir(tmp_path, "R2d", b"incumbent weights")
    run_dir(tmp_path, "B3", b"candidate weights")
    nom = sealed_nomination(tmp_path, clears)
    out = tmp_path / "runs/r3-nominee/final"
    continual.main(
        ["nominee", "--round", "r3", "--nomination", str(nom), "--runs", "runs", "--out", str(out)]
    )
    served = "B3" if clears else "R2d"
    assert (out / "adapter_model.safetensors").read_bytes() == (
        tmp_path / "runs" / served / "final/adapter_model.safetensors"
    ).read_bytes()
    alias = json.loads((out / "nominee.json").read_text())
    assert (alias["arm"], alias["kept"]) == (served, not clears)
    assert not (out / "training_evidence.json").exists()  # the budget counts each training once
    manifest.verify(out)


def test_a_nominee_is_refused_from_an_edited_nomination(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir(tmp_path, "R2d", b"incumbent weights")
    run_dir(tmp_path, "B3", b"candidate weights")
    nom = sealed_nomination(tmp_path, False)
    rec = json.loads(nom.read_text())
    nom.write_text(json.dumps({**rec, "promoted": "B3"}))  # a hand edit
    with pytest.raises(nominate.SealError, match="edited after it was sealed|do not"):
        continual.write_nominee(
            "r3", str(nom), tmp_path / "runs", tmp_path / "runs/r3-nominee/final"
        )
    assert not (tmp_path / "runs/r3-nominee").exists()
