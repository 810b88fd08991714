"""arenaflow.rounds.nominate and arenaflow.rounds.bar: registration, refusal, clauses, promotion
and its
record."""

from __future__ import annotations

import json
import re

import pytest

from arenaflow import io
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout_file, readout_rows
from arenaflow.rounds import bar, nominate, registry, verdicts

BAR = [
    {"metric": "delta", "op": ">", "value": 0.0},
    {"metric": "wins_minus_losses", "op": ">=", "value": 3},
]


def comparison(delta: float, wins: int, losses: int, p: float = 0.5, acc: float = 50.0) -> dict:
    return {
        "delta": delta,
        "wins": wins,
        "losses": losses,
        "wins_minus_losses": wins - losses,
        "p_value": p,
        "accuracy": acc,
        "ci95": [delta - 5, delta + 5],
    }


def round_(candidates, bar=BAR, incumbent="R2d") -> dict:
    return {
        "suite": "math",
        "regime": "greedy",
        "incumbent": incumbent,
        "candidates": list(candidates),
        "bar": bar,
    }


def test_of_two_that_clear_the_larger_delta_is_promoted():
    comps = {
        "B1": comparison(2.0, 10, 4),  # clears
        "B2": comparison(-1.0, 3, 6),  # fails delta
        "B3": comparison(3.5, 15, 4),  # clears, larger delta
        "B4": comparison(5.0, 5, 3),  # larger delta but W-L = 2 < 3
    }
    out = verdicts.nominate("r3", round_(comps), comps)
    assert out["promoted"] == "B3"
    assert [v["clears"] for v in out["candidates"]] == [True, False, True, False]
    assert "B3" in out["reason"] and "2 that clear" in out["reason"]
    assert "+3.50" in out["reason"]


def test_equal_deltas_promote_the_first_listed():
    comps = {"B2": comparison(2.0, 9, 3), "B1": comparison(2.0, 8, 2)}
    assert verdicts.nominate("r", round_(["B2", "B1"]), comps)["promoted"] == "B2"
    assert verdicts.nominate("r", round_(["B1", "B2"]), comps)["promoted"] == "B1"


def test_when_nothing_clears_the_incumbent_stays_with_a_reason():
    comps = {"B1": comparison(-0.5, 4, 5), "B2": comparison(1.0, 6, 4)}
    out = verdicts.nominate("r3", round_(comps), comps)
    assert out["promoted"] == "R2d"
    assert not any(v["clears"] for v in out["candidates"])
    assert "no candidate clears" in out["reason"] and "R2d" in out["reason"]


def test_each_clause_records_its_number_observed_value_threshold_and_verdict():
    comps = {"B1": comparison(1.0, 6, 4)}  # delta holds, W-L = 2 fails
    out = verdicts.nominate("r3", round_(comps), comps)
    (v,) = out["candidates"]
    assert v["arm"] == "B1"
    common = {"suite": "math", "regime": "greedy", "vs": "incumbent", "against": "R2d"}
    assert v["clauses"] == [
        {
            "clause": 1,
            "metric": "delta",
            "op": ">",
            "value": 0.0,
            **common,
            "threshold": 0.0,
            "observed": 1.0,
            "holds": True,
        },
        {
            "clause": 2,
            "metric": "wins_minus_losses",
            "op": ">=",
            "value": 3,
            **common,
            "threshold": 3,
            "observed": 2,
            "holds": False,
        },
    ]
    assert v["failed"] == [2]
    assert (v["delta"], v["wins"], v["losses"]) == (1.0, 6, 4)
    assert v["ci95"] == [-4.0, 6.0]


@pytest.mark.parametrize(
    "op, observed, value, holds",
    [
        (">", 0.0, 0.0, False),
        (">=", 0.0, 0.0, True),
        ("<", 0.05, 0.05, False),
        ("<=", 0.05, 0.05, True),
        ("<", 0.04, 0.05, True),
        (">", -1.0, 0.0, False),
    ],
)
def test_clause_operators_at_the_boundary(op, observed, value, holds):
    rnd = round_(["B1"], bar=[{"metric": "p_value", "op": op, "value": value}])
    v = verdicts.judge(
        "B1", rnd, {("math", "greedy", "B1", "R2d"): comparison(1.0, 5, 1, p=observed)}
    )
    assert v["clauses"][0]["holds"] is holds
    assert v["clears"] is holds


def test_output_records_round_bar_and_its_sha256():
    comps = {"B1": comparison(2.0, 10, 4)}
    out = verdicts.nominate("r3", round_(comps), comps)
    assert (out["round"], out["suite"], out["regime"], out["incumbent"]) == (
        "r3",
        "math",
        "greedy",
        "R2d",
    )
    assert out["bar"] == BAR
    assert out["bar_sha256"] == nominate.bar_sha256(bar.resolve(round_(comps)))
    assert re.fullmatch(r"[0-9a-f]{64}", out["bar_sha256"])


def test_bar_sha256_changes_when_the_bar_changes():
    looser = [dict(BAR[0]), dict(BAR[1], value=2)]
    flipped = [dict(BAR[0], op=">="), dict(BAR[1])]
    shorter = [dict(BAR[0])]
    hashes = {nominate.bar_sha256(b) for b in (BAR, looser, flipped, shorter)}
    assert len(hashes) == 4


def test_bar_sha256_ignores_key_order_within_a_clause():
    reordered = [{"value": c["value"], "op": c["op"], "metric": c["metric"]} for c in BAR]
    assert nominate.bar_sha256(reordered) == nominate.bar_sha256(BAR)


def test_missing_comparison_is_an_error_naming_the_candidate():
    with pytest.raises(ValueError, match="B2 vs R2d on math/greedy"):
        verdicts.nominate("r3", round_(["B1", "B2"]), {"B1": comparison(1.0, 5, 1)})


def test_nothing_clears_keeps_the_incumbent_and_says_which_clause_each_failed():
    comps = {"B1": comparison(-0.5, 4, 5), "B2": comparison(1.0, 6, 4)}
    out = verdicts.nominate("r3", round_(comps), comps)
    assert out["promoted"] == "R2d"
    assert [v["failed"] for v in out["candidates"]] == [[1, 2], [2]]
    assert (
        "B2 fails clause 2: wins_minus_losses vs R2d on math/greedy = 2 >= 3 fails" in out["reason"]
    )


def test_an_undefined_number_never_holds():
    comps = {"B1": {**comparison(3.0, 9, 1), "t": None}}  # t over replicates with K = 1
    rnd = round_(["B1"], bar=[{"metric": "t", "op": "<", "value": 100}])
    (v,) = verdicts.nominate("r", rnd, comps)["candidates"]
    (c,) = v["clauses"]
    assert c["observed"] is None and c["holds"] is False and "undefined" in c["undefined"]
    assert not v["clears"]


def test_bar_sha256_covers_the_resolved_meaning_not_just_the_clauses():
    a = round_(["B1"])
    b = {**a, "incumbent": "R220"}  # same clauses, another incumbent
    c = {**a, "regime": "served"}  # same clauses, read in another regime
    shas = {nominate.bar_sha256(bar.resolve(r)) for r in (a, b, c)}
    assert len(shas) == 3


# --- clauses against a control, against the noise floor, on levels ------------------------


def with_levels(delta, wins, losses, cand: dict, ref: dict, **extra) -> dict:
    lv = dict.fromkeys(bar.LEVELS, 0.0)
    return {
        **comparison(delta, wins, losses),
        "levels": {"cand": {**lv, **cand}, "ref": {**lv, **ref}},
        **extra,
    }


# docs/lineages.md#000-the-pre-registered-bar, clauses (1)-(3); (4) is a human read
FINAL_BLOCKS = [
    {"suite": "chat", "regime": "served", "metric": "words_t", "op": ">", "value": 1.9},
    {
        "suite": "chat",
        "regime": "served",
        "metric": "loop_rate",
        "vs": "control",
        "op": "<=",
        "value": 2.0,
    },
    {
        "suite": "chat",
        "regime": "served",
        "metric": "empty_rate",
        "vs": "control",
        "op": "<=",
        "value": 2.0,
    },
    {
        "suite": "math",
        "regime": "served",
        "metric": "delta",
        "op": ">=",
        "noise": {"stat": "mean_abs_delta", "times": -1},
    },
    {"metric": "truncation_rate", "op": "<", "value": 5.0},
]


def final_round(candidates=("finR", "finC")) -> dict:
    return {
        "suite": "math",
        "regime": "served",
        "incumbent": "B3f",
        "control": "B3f",
        "candidates": list(candidates),
        "bar": FINAL_BLOCKS,
    }


def final_comparisons(fin_r_loop=4.40) -> tuple[dict, dict]:
    comps = {
        # finR: length t = +2.33, but loop rate 0.00% -> 4.40%
        # (lineage 000: "failed bar (2) by 2.4 pt")
        ("chat", "served", "finR", "B3f"): with_levels(
            0.5, 10, 8, {"loop_rate": fin_r_loop}, {"loop_rate": 0.0}, words_t=2.33
        ),
        ("math", "served", "finR", "B3f"): with_levels(-1.31, 20, 26, {"truncation_rate": 1.3}, {}),
        ("chat", "served", "finC", "B3f"): with_levels(0.0, 5, 5, {}, {}, words_t=-0.8),
        ("math", "served", "finC", "B3f"): with_levels(0.65, 22, 19, {"truncation_rate": 1.0}, {}),
    }
    noises = {("math", "served", "B3f"): {"mean_abs_delta": 2.61, "max_abs_t": 1.91}}
    return comps, noises


def test_seeds_final_blocks_bar_rejects_fin_r_on_clause_2_and_keeps_the_incumbent():
    comps, noises = final_comparisons()
    out = verdicts.nominate("fin", final_round(), comps, noises)
    assert out["promoted"] == "B3f"
    fin_r, fin_c = out["candidates"]
    assert fin_r["failed"] == [2] and fin_c["failed"] == [1]
    loop = fin_r["clauses"][1]
    assert loop["against"] == "B3f" and loop["observed"] == pytest.approx(4.40)
    assert loop["observed"] - loop["threshold"] == pytest.approx(2.4)  # "by 2.4 pt"
    math = fin_r["clauses"][3]
    assert math["threshold"] == pytest.approx(-2.61) and math["holds"]
    assert math["threshold_from"] == "-1 x mean_abs_delta of noise/math/served/B3f.json"
    trunc = fin_r["clauses"][4]
    assert (trunc["vs"], trunc["against"], trunc["observed"]) == ("none", None, 1.3)


def test_a_candidate_clearing_every_final_blocks_clause_is_promoted():
    comps, noises = final_comparisons(fin_r_loop=1.18)  # the alpha = 0.6 blend's loop rate
    out = verdicts.nominate("fin", final_round(), comps, noises)
    assert out["promoted"] == "finR"
    assert out["candidates"][0]["clears"]


def test_noise_clause_is_relative_to_the_measured_floor():
    comps, noises = final_comparisons(fin_r_loop=0.0)
    comps[("math", "served", "finR", "B3f")]["delta"] = -2.62  # just beyond the floor
    out = verdicts.nominate("fin", final_round(), comps, noises)
    assert out["candidates"][0]["failed"] == [4]
    noises[("math", "served", "B3f")]["mean_abs_delta"] = 3.0
    assert verdicts.nominate("fin", final_round(), comps, noises)["promoted"] == "finR"


def test_final_blocks_bar_is_valid_config_and_lists_what_it_reads(repo_root):
    import copy

    import yaml

    from arenaflow import config

    raw = yaml.safe_load((repo_root / "config/config.yaml").read_text())
    cfg = copy.deepcopy(raw)
    cfg["evals"]["chat"] = {
        "pool": "math_eval",
        "regimes": {"served": {"as_served": "B3f", "replicates": 3}},
    }
    bar_ = [{k: v for k, v in c.items()} for c in FINAL_BLOCKS]
    cfg["rounds"]["fin"] = {
        "suite": "math",
        "regime": "served",
        "incumbent": "B3",
        "control": "R2d",
        "candidates": ["B1", "B2"],
        "bar": bar_,
    }
    res = config.resolve(cfg, repo_root=repo_root)
    need = bar.requirements(
        res["rounds"]["fin"], lambda s, r: res["evals"][s]["regimes"][r]["replicates"]
    )
    assert need["compare"] == [
        "compare/math/served/B1__B3.json",
        "compare/chat/served/B1__B3.json",
        "compare/chat/served/B1__R2d.json",
        "compare/math/served/B2__B3.json",
        "compare/chat/served/B2__B3.json",
        "compare/chat/served/B2__R2d.json",
    ]
    assert need["noise"] == ["noise/math/served/B3.json"]
    assert need["readouts"] == [
        f"readouts/{s}/{a}/served.r{k}.parquet"
        for a in ("B1", "B2")
        for s in ("math", "chat")
        for k in range(3)
    ]


def test_shipped_round_r3_reads_a_greedy_comparison_per_candidate(repo_root):
    import yaml

    from arenaflow import config

    res = config.resolve(
        yaml.safe_load((repo_root / "config/config.yaml").read_text()), repo_root=repo_root
    )
    need = bar.requirements(
        res["rounds"]["r3"], lambda s, r: res["evals"][s]["regimes"][r]["replicates"]
    )
    cands = (
        "B1",
        "B2",
        "B3",
        "B4",
        "soup",
        "dose-a0p5",
        "dose-a1p5",
        "dose-a2",
    )  # the sweep, then merges
    assert need == {
        "compare": [f"compare/math/greedy/{a}__R2d.json" for a in cands],
        "noise": [],
        "readouts": [f"readouts/math/{a}/greedy.r0.parquet" for a in cands],
    }


def test_a_readouts_levels_are_exactly_the_level_metrics_a_bar_can_name():
    import pandas as pd

    df = pd.DataFrame(
        {
            "correct": [True, False],
            "truncated": [False, False],
            "empty": [False, True],
            "loop": [False, False],
            "fffd": [False, False],
            "n_words": [3, 0],
            "n_tokens": [4, 1],
        }
    )
    assert tuple(comparisons.levels(df)) == bar.LEVELS


# --- registration: the bar is written before the readouts it judges ------------------------


def write_readout(path, arm, correct, replicate=0):
    import pandas as pd

    n = len(correct)
    df = pd.DataFrame(
        {
            "arm": arm,
            "item_id": [f"i{j}" for j in range(n)],
            "category": "add",
            "prompt_sha256": [f"p{j}" for j in range(n)],
            "target_sha256": [f"t{j}" for j in range(n)],
            "completion": ["2 + 2 = 4. The answer is 4."] * n,
            "n_tokens": 12,
            "stopped": True,
            "pred": "4",
            "strict": correct,
            "correct": correct,
            "replicate": replicate,
        }
    )
    readout_file.write_readout(
        readout_rows.structure(df), path, {"arm": arm, "replicate": replicate}
    )
    return str(path)


class Round:
    """A round r3 built on disk the way the workflow builds it: register, read out, compare."""

    def __init__(self, tmp_path, bar_=BAR):
        self.dir, self.rnd = tmp_path, round_(["B1", "B3"], bar=bar_)
        self.reg = str(tmp_path / "nominations/r3.bar.json")

    def register(self, rnd=None):
        nominate.main(
            [
                "register",
                "--round",
                "r3",
                "--round-json",
                json.dumps(rnd or self.rnd),
                "--out",
                self.reg,
            ]
        )

    def score(self):
        d = self.dir
        ref = write_readout(
            d / "R2d.r0.parquet", "R2d", [True, False, False, True, False, False] * 4
        )
        self.readouts, self.compare = [], []
        for arm, correct in {
            "B1": [True, True, False, True, False, False] * 4,
            "B3": [True, True, True, True, False, False] * 4,
        }.items():
            self.readouts.append(write_readout(d / f"{arm}.r0.parquet", arm, correct))
            self.compare.append(str(d / f"compare/math/greedy/{arm}__R2d.json"))
            comparisons.main(
                [
                    "compare",
                    "--suite",
                    "math",
                    "--regime",
                    "greedy",
                    "--cand",
                    self.readouts[-1],
                    "--ref",
                    ref,
                    "--out",
                    self.compare[-1],
                ]
            )

    def judge(self, rnd=None):
        out = self.dir / "nominations/r3.json"
        nominate.main(
            [
                "judge",
                "--round",
                "r3",
                "--round-json",
                json.dumps(rnd or self.rnd),
                "--registration",
                self.reg,
                "--compare",
                *self.compare,
                "--readouts",
                *self.readouts,
                "--out",
                str(out),
            ]
        )
        return io.read_json(out)


def test_registered_before_scoring_nominates(tmp_path):
    r = Round(tmp_path)
    r.register()
    reg = io.read_json(r.reg)
    assert reg["bar_sha256"] == nominate.bar_sha256(bar.resolve(r.rnd))
    assert reg["bar"] == BAR and reg["round"] == "r3" and reg["registered_utc"].endswith("+00:00")
    r.score()
    out = r.judge()
    # B1 fixes 4 items (+16.7 pt), B3 fixes 8 (+33.3 pt): both clear, the larger delta wins
    assert [v["clears"] for v in out["candidates"]] == [True, True]
    assert out["promoted"] == "B3"
    assert out["registration"]["bar_sha256"] == reg["bar_sha256"]
    assert out["registration"]["readouts_checked"] == 2


LOOSER = [BAR[0], {**BAR[1], "value": 2}]


def refused(fn, *args) -> None:
    """Run a CLI step that must refuse: exit 1."""
    with pytest.raises(SystemExit) as e:
        fn(*args)
    assert e.value.code == 1


def snapshot(r: Round) -> dict:
    return {p.name: p.read_bytes() for p in (r.dir / "nominations").rglob("*") if p.is_file()}


def test_a_bar_edited_after_scoring_is_refused_and_nothing_is_rewritten(tmp_path, capsys):
    r = Round(tmp_path)
    r.register()
    r.score()
    r.judge()
    before = snapshot(r)
    looser = {**r.rnd, "bar": LOOSER}
    refused(r.judge, looser)  # the config changed, the registration did not
    err = capsys.readouterr().err
    assert (
        "not the bar registered" in err
        and "a new round id is the honest way to change a bar" in err
    )
    refused(r.register, looser)  # what Snakemake's params trigger does: register again
    err = capsys.readouterr().err
    assert (
        "round r3: refused" in err
        and "python -m arenaflow.rounds.reregister --round r3" in err
        and "registry/r3.jsonl" in err
    )
    assert snapshot(r) == before  # registration, registry and nomination untouched


def test_a_different_bar_is_refused_whatever_the_readouts_times(tmp_path, capsys):
    """The probe: edit the bar, make the readouts again (byte-identical rows, later times)."""
    r = Round(tmp_path)
    r.register()
    r.score()
    looser = {**r.rnd, "bar": LOOSER}
    refused(r.register, looser)
    r.score()  # --forcerun readout: every candidate readout now postdates any registration
    refused(r.judge, looser)
    assert "not the bar registered" in capsys.readouterr().err


def test_restoring_the_registered_bar_makes_the_round_work_again(tmp_path):
    r = Round(tmp_path)
    r.register()
    reg = io.read_json(r.reg)
    r.score()
    first = r.judge()
    looser = {**r.rnd, "bar": LOOSER}
    refused(r.register, looser)
    refused(r.judge, looser)
    (tmp_path / "nominations/r3.bar.json").unlink()  # as `--forcerun register_bar` would
    r.register()  # the original bar: copied out of the registry with its original time
    assert io.read_json(r.reg)["registered_utc"] == reg["registered_utc"]
    again = r.judge()
    assert again["promoted"] == first["promoted"] == "B3"
    assert again["digest"] == first["digest"]  # the same judgement of the same files


def test_the_registry_is_append_only_and_keeps_the_first_registration(tmp_path):
    r = Round(tmp_path)
    r.register()
    r.register()
    r.register({**r.rnd, "candidates": ["B1"]})  # not the bar: same sha256, nothing appended
    events = io.read_jsonl(tmp_path / "nominations/registry/r3.jsonl")
    assert [e["event"] for e in events] == ["registered"]
    assert io.read_json(r.reg)["registered_utc"] == events[0]["registered_utc"]


def test_the_dag_check_reads_the_registry_or_a_bar_json_from_before_it(tmp_path):
    r = Round(tmp_path)
    noms = tmp_path / "nominations"
    assert nominate.registered(noms, "r3") == (None, str(noms / "registry/r3.jsonl"))
    r.register()
    nominate.check_bar("r3", r.rnd, *nominate.registered(noms, "r3"))
    with pytest.raises(
        nominate.RegistrationError, match="registered for r3 at .*/registry/r3.jsonl"
    ):
        nominate.check_bar("r3", {**r.rnd, "bar": LOOSER}, *nominate.registered(noms, "r3"))
    (noms / "registry/r3.jsonl").unlink()  # results from before the registry: the .bar.json counts
    with pytest.raises(nominate.RegistrationError, match="r3.bar.json"):
        nominate.check_bar("r3", {**r.rnd, "bar": LOOSER}, *nominate.registered(noms, "r3"))


def test_a_bar_json_from_before_the_registry_is_adopted_with_its_time(tmp_path):
    r = Round(tmp_path)
    old = registry.register("r3", r.rnd, now="2026-01-01T00:00:00+00:00")
    io.write_json(r.reg, old)
    r.register()
    assert io.read_json(r.reg)["registered_utc"] == old["registered_utc"]
    (event,) = io.read_jsonl(tmp_path / "nominations/registry/r3.jsonl")
    assert event["registered_utc"] == old["registered_utc"] and event["adopted"]


def test_a_hand_edited_registration_file_is_refused(tmp_path, capsys):
    r = Round(tmp_path)
    r.register()
    r.score()
    reg = io.read_json(r.reg)
    io.write_json(r.reg, {**reg, "registered_utc": "2020-01-01T00:00:00+00:00"})
    refused(r.judge)
    assert "edited by hand" in capsys.readouterr().err


# --- the seal -----------------------------------------------------------------------------


def test_a_nomination_is_sealed_with_the_sha256_of_what_it_judged(tmp_path):
    from arenaflow import manifest

    r = Round(tmp_path)
    r.register()
    r.score()
    out = r.judge()
    assert set(out["inputs"]) == {r.reg, *r.compare, *r.readouts}
    assert all(out["inputs"][p] == manifest.sha256_file(p) for p in out["inputs"])
    assert out["digest"] == nominate.digest(out)
    assert nominate.load_sealed(tmp_path / "nominations/r3.json", root="/") == out
    nominate.main(["verify", str(tmp_path / "nominations/r3.json"), "--root", "/"])


def test_judge_records_beside_each_registered_mde_the_one_its_readouts_measured(tmp_path, capsys):
    import numpy as np
    from statsmodels.stats.power import TTestPower

    from arenaflow.schema import schema_defaults

    r = Round(tmp_path)
    promotion = {**schema_defaults("promotion"), "underpowered": "warn"}
    suites = {"math": {"n": 24, "replicates": {"greedy": 1}, "gate_below_snr": False}}
    r.rnd = {**r.rnd, "gating": {"promotion": promotion, "suites": suites}}
    r.register()
    plan = io.read_json(r.reg)["power"]
    r.score()
    out = r.judge()
    d = TTestPower().solve_power(effect_size=None, nobs=24, alpha=0.05, power=0.8)
    b1 = np.r_[np.ones(4), np.zeros(20)] * 100  # B1 fixes 4 of the 24 items, loses none
    rows = out["power_measured"]["clauses"]
    order = [(x["clause"], x["candidate"]) for x in rows]
    assert order == [(1, "B1"), (1, "B3"), (2, "B1"), (2, "B3")]
    assert rows[0]["mde"] == pytest.approx(float(np.ravel(d)[0]) * np.std(b1, ddof=1))
    assert [x["mde_planned"] for x in rows[::2]] == [c["mde"] for c in plan["clauses"]]
    assert rows[2]["asks"] == pytest.approx(100 * 3 / 24)  # W - L >= 3 over 24 items, in points
    # delta > 0 asks for nothing, so it is underpowered however the readouts came out
    assert [x["underpowered_measured"] for x in rows[:2]] == [True, True]
    assert [v["clears"] for v in out["candidates"]] == [True, True] and out["promoted"] == "B3"
    assert "WARNING (underpowered as measured; the decision stands): round r3: clause 1" in (
        capsys.readouterr().err
    )
    assert nominate.load_sealed(tmp_path / "nominations/r3.json", root="/") == out


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda n: n.update(promoted="B1"), "edited after it was sealed"),
        (lambda n: n["candidates"][0].update(delta=99.0), "edited after it was sealed"),
        (lambda n: n.pop("digest"), "not sealed"),
        (
            lambda n: n.update(promoted="B1", digest=nominate.digest({**n, "promoted": "B1"})),
            "promotes 'B1', which its own verdicts do not",
        ),
    ],
)
def test_a_hand_edited_nomination_is_refused(tmp_path, capsys, edit, message):
    r = Round(tmp_path)
    r.register()
    r.score()
    nom = r.judge()
    edit(nom)
    path = tmp_path / "nominations/r3.json"
    io.write_json(path, nom)
    with pytest.raises(nominate.SealError, match=message):
        nominate.load_sealed(path)
    refused(nominate.main, ["verify", str(path)])
    assert message.split(",")[0] in capsys.readouterr().err


def test_a_judged_file_changed_after_sealing_is_named(tmp_path):
    r = Round(tmp_path)
    r.register()
    r.score()
    r.judge()
    write_readout(r.readouts[0], "B1", [False] * 24)
    with pytest.raises(nominate.SealError, match=r"B1.r0.parquet, which it judged, changed since"):
        nominate.load_sealed(tmp_path / "nominations/r3.json", root="/")
    nominate.load_sealed(tmp_path / "nominations/r3.json")  # without root: the seal alone


def test_a_bundle_is_not_built_from_a_hand_edited_nomination(tmp_path, capsys, repo_root):
    """The probe: `promoted` edited by hand. The bundle would serve that arm under the card of
    the real nominee's numbers; it is refused before anything is assembled."""
    from arenaflow.bundles import build as bundles

    r = Round(tmp_path)
    r.register()
    r.score()
    nom = r.judge()
    path = tmp_path / "nominations/r3.json"
    io.write_json(path, {**nom, "promoted": "B1"})
    with pytest.raises(SystemExit) as e:
        bundles.main(
            [
                "build",
                "--bundle",
                "B3f",
                "--nomination",
                str(path),
                "--lineage-json",
                "{}",
                "--runs",
                str(tmp_path / "runs"),
                "--corpora",
                str(tmp_path / "corpora"),
                "--base-model",
                str(repo_root / "models/tiny-arith"),
                "--bundle-json",
                "{}",
                "--out",
                str(tmp_path / "bundles/B3f"),
            ]
        )
    assert e.value.code == 1
    assert "check failed, no bundle written: " in capsys.readouterr().err
    assert not (tmp_path / "bundles").exists()


def test_refusal_uses_recorded_times_not_mtimes(tmp_path, capsys):
    import os

    r = Round(tmp_path)
    r.score()  # scored first ...
    r.register()  # ... registered after
    for p in r.readouts:  # a later `touch` makes every readout look newer; the record does not move
        os.utime(p, (2e9, 2e9))
    with pytest.raises(SystemExit):
        r.judge()
    assert "recorded in the file" in capsys.readouterr().err


def test_a_readout_without_a_recorded_time_falls_back_to_its_mtime(tmp_path, capsys):
    import os

    import pandas as pd

    r = Round(tmp_path)
    r.register()
    r.score()
    legacy = tmp_path / "legacy.parquet"
    pd.read_parquet(r.readouts[0]).to_parquet(legacy)  # no arenaflow metadata
    assert nominate.readout_time(str(legacy))[1] == "mtime"
    os.utime(legacy, (1e9, 1e9))  # 2001: before the registration
    r.readouts[0] = str(legacy)
    with pytest.raises(SystemExit):
        r.judge()
    assert "file mtime" in capsys.readouterr().err


def test_check_registration_accepts_equal_times_and_names_the_round():
    rnd = round_(["B1"])
    reg = registry.register("r3", rnd, now="2026-01-01T00:00:00+00:00")
    nominate.check_registration("r3", rnd, reg, {"x": ("2026-01-01T00:00:00+00:00", "recorded")})
    with pytest.raises(nominate.RegistrationError, match="registration is for round 'r3'"):
        nominate.check_registration("r4", rnd, reg, {})
