"""arenaflow.rounds.gate: a bar's power plan at registration and its power as measured at
nomination, its p-value clauses adjusted together, clustered clauses, and the signal-to-noise
admission of its suites."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from arenaflow.config.load import load_configs
from arenaflow.config.resolve import resolve
from arenaflow.evals import power
from arenaflow.rounds import bar, gate, registry, verdicts
from arenaflow.schema import ConfigError, schema_defaults


def gating(n=300, replicates=None, **promotion) -> dict:
    return {
        "promotion": {**schema_defaults("promotion"), **promotion},
        "suites": {
            s: {"n": n, "replicates": replicates or {"greedy": 1}, "gate_below_snr": False}
            for s in ("math", "chat")
        },
    }


def round_(bar_, **g) -> dict:
    return {
        "suite": "math",
        "regime": "greedy",
        "incumbent": "R",
        "candidates": ["B"],
        "bar": bar_,
        "gating": gating(**g),
    }


def comp(p: float, acc: float = 60.0, ref: float = 50.0, **extra) -> dict:
    return {
        "delta": acc - ref,
        "wins": 9,
        "losses": 3,
        "p_value": p,
        "accuracy": acc,
        "ref_accuracy": ref,
        **extra,
    }


def two_arms() -> dict:
    """B at 53 and C at 51 against R at 50: a signal (range) of 3 points."""
    return {("math", "greedy", a, "R"): comp(0.5, acc) for a, acc in (("B", 53.0), ("C", 51.0))}


TWO_TESTS = [
    {"metric": "p_value", "op": "<", "value": 0.05},
    {"suite": "chat", "metric": "p_value", "op": "<", "value": 0.05},
]


def test_a_raw_p_that_passes_fails_once_holm_adjusts_it_and_both_are_recorded():
    rnd = round_(TWO_TESTS)
    comps = {("math", "greedy", "B", "R"): comp(0.03), ("chat", "greedy", "B", "R"): comp(0.04)}
    v = verdicts.nominate("r", rnd, comps)["candidates"][0]
    _, want, _, _ = multipletests([0.03, 0.04], method="holm")  # 0.06, 0.06
    for c, raw, adj in zip(v["clauses"], (0.03, 0.04), want):
        assert c["p_raw"] == raw < 0.05 < adj and c["p_adjusted"] == pytest.approx(adj)
        assert c["observed"] == c["p_adjusted"] and c["adjust"] == "holm" and not c["holds"]
    assert not v["clears"] and v["failed"] == [1, 2]
    assert "= 0.06 (holm-adjusted; raw 0.03) < 0.05 fails" in bar.describe(v["clauses"][0])


def test_the_method_is_configurable_and_part_of_the_bars_sha256():
    holm, bonf = round_(TWO_TESTS), round_(TWO_TESTS, multiplicity="bonferroni")
    assert bar.bar_sha256(bar.resolve(holm)) != bar.bar_sha256(bar.resolve(bonf))
    comps = {("math", "greedy", "B", "R"): comp(0.01), ("chat", "greedy", "B", "R"): comp(0.04)}
    v = verdicts.judge("B", {**bonf, "bar_resolved": bar.resolve(bonf)}, comps)
    _, want, _, _ = multipletests([0.01, 0.04], method="bonferroni")
    assert [c["p_adjusted"] for c in v["clauses"]] == pytest.approx(list(want))  # 0.02, 0.08
    assert [c["holds"] for c in v["clauses"]] == [True, False]


def test_a_single_test_is_not_adjusted_and_an_unchanged_bar_keeps_its_sha256():
    one = [{"metric": "delta", "op": ">", "value": 0.0}, TWO_TESTS[0]]
    resolved = bar.resolve(round_(one))
    assert all(
        set(c) <= {"clause", "metric", "op", "suite", "regime", "vs", "against", "value"}
        for c in resolved
    )
    v = verdicts.judge("B", round_(one), {("math", "greedy", "B", "R"): comp(0.03)})
    assert v["clauses"][1]["observed"] == 0.03 and "p_raw" not in v["clauses"][1]


def test_se_clustered_reads_the_clustered_test_and_is_refused_on_other_metrics():
    c = {"metric": "p_value", "op": "<", "value": 0.05, "se": "clustered"}
    clustered = {"clustered": {"clustered": {"p_value": 0.2, "t": 1.3}}}
    v = verdicts.judge("B", round_([c]), {("math", "greedy", "B", "R"): comp(0.01, **clustered)})
    assert v["clauses"][0]["observed"] == 0.2 and not v["clears"]  # item-level p 0.01 would hold
    bad = round_([{"metric": "delta", "op": ">", "value": 0, "se": "clustered"}])
    errs = bar.validate(bad, lambda s, r: 1, {"R", "B"}, lambda s: 1)
    assert errs[0][0] == "bar/0/se" and "'delta'" in errs[0][1]


def test_an_underpowered_clause_is_refused_naming_round_suite_and_clause():
    rnd = round_(
        [
            TWO_TESTS[1],
            {"suite": "chat", "metric": "delta", "op": ">=", "value": 2.0},
            {"metric": "delta", "op": ">", "value": 12.0},
        ]
    )
    rnd["bar"].pop(0)  # chat's delta has no test beside it now
    with pytest.raises(registry.RegistrationError) as e:
        registry.register("r9", rnd)
    mde = power.mde(300, 0.5)
    assert "round r9: clause 1 (delta >= 2 on suite chat/greedy)" in str(e.value)
    assert f"{mde:.3g} points" in str(e.value) and "promotion.underpowered" in str(e.value)


def test_with_warn_the_registration_records_the_plan_and_the_warning():
    rnd = round_(
        [
            {"metric": "delta", "op": ">", "value": 0.0},
            TWO_TESTS[1],
            {"suite": "chat", "metric": "delta", "op": ">", "value": 0.0},
        ],
        underpowered="warn",
        parent_accuracy=80,
    )
    rec = registry.register("r9", rnd)
    p = rec["power"]
    mde = power.mde(300, power.planning_discordance(0.8))
    assert p["suites"]["math/greedy"]["mde"] == pytest.approx(mde)
    assert [c["status"][:6] for c in p["clauses"]] == ["underp", "asks f", "tested"]
    assert len(p["underpowered"]) == 1 and "clause 1" in p["underpowered"][0]
    assert "gating" not in rec["round_config"]


def test_a_round_without_gating_or_a_suite_of_unknown_size_is_not_checked():
    assert (
        gate.power_plan("r", {k: v for k, v in round_(TWO_TESTS).items() if k != "gating"}) is None
    )
    plan = gate.power_plan("r", round_([{"metric": "delta", "op": ">", "value": 0}], n=None))
    assert plan["clauses"][0]["status"].startswith("not checked") and not plan["underpowered"]


def snr_round(**kw) -> dict:
    rnd = round_(
        [{"metric": "delta", "op": ">", "value": 0.0}], min_snr=2.0, replicates={"greedy": 3}
    )
    rnd["candidates"] = ["B", "C"]
    rnd["bar"][0].update(kw)
    return rnd


def test_a_suite_below_min_snr_cannot_gate_unless_the_config_admits_it():
    comps = two_arms()
    noises = {("math", "greedy", "R"): {"spread": 2.0}}
    out = verdicts.nominate("r", snr_round(), comps, noises)
    assert out["snr"]["math/greedy"]["snr"] == pytest.approx(1.5)  # (53 - 50) / 2
    c = out["candidates"][0]["clauses"][0]
    assert not c["holds"] and "not admitted" in c["undefined"] and "1.5" in c["undefined"]
    admitted = verdicts.nominate("r", snr_round(admit_low_snr=True), comps, noises)
    assert admitted["candidates"][0]["clears"]
    assert admitted["candidates"][0]["clauses"][0]["admitted_below_snr"]
    loud = {("math", "greedy", "R"): {"spread": 1.0}}
    assert verdicts.nominate("r", snr_round(), comps, loud)["candidates"][0]["clears"]


def test_min_snr_reads_the_incumbents_noise_floor_and_needs_one():
    assert bar.snr_noise(snr_round(), lambda s, r: 3) == [("math", "greedy", "R")]
    no_floor = snr_round()
    no_floor["gating"]["suites"]["math"]["replicates"] = {"greedy": 1}
    ((key, msg),) = gate.snr_errors(no_floor)
    assert key == "bar/0" and "math/greedy" in msg and "gate_below_snr" in msg


def test_config_resolution_writes_gating_and_refuses_min_snr_without_a_noise_floor():
    cfg, files = load_configs(["config/config.yaml"])
    rnd = resolve(copy.deepcopy(cfg), config_file="c")["rounds"]["r3"]
    assert rnd["gating"]["suites"]["math"]["n"] == 300
    assert rnd["gating"]["promotion"]["underpowered"] == "warn"  # the toy's recorded decision
    cfg["promotion"]["min_snr"] = 3
    with pytest.raises(ConfigError, match=r"key 'rounds/r3/bar/0'.*min_snr needs a noise floor"):
        resolve(cfg, config_file="c")


def test_the_round_report_and_the_card_show_each_suites_snr_and_the_registered_mde():
    import jinja2

    from arenaflow.rounds import report

    rnd = snr_round(admit_low_snr=True)
    comps = two_arms()
    nom = verdicts.nominate("r", rnd, comps, {("math", "greedy", "R"): {"spread": 2.0}})
    assert nom["snr"]["math/greedy"]["admission"] == "below min_snr 2, admitted by the config"
    served = {("served", "B"): {"accuracy": 60.0, "ref_accuracy": 50.0}}
    rows = report.snr_rows(rnd, nom, served, {("served", "R"): {"spread": 4.0}})
    assert rows["math/served"]["snr"] == pytest.approx(2.5)
    assert "admission" not in rows["math/served"]
    page = report.snr_html(rows)
    assert "<th>math/greedy</th><td>3</td><td>2</td><td>1.5</td>" in page
    assert "admitted by the config" in page and "not gated on" in page
    plan = registry.register("r", {**rnd, "gating": gating(underpowered="warn")})["power"]
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("arenaflow", "templates"), undefined=jinja2.StrictUndefined
    )
    card = env.get_template("card_bar.md.j2").render(
        nomination={**nom, "registration": {"power": plan}}
    )
    assert f"math/greedy\t300\t{power.mde(300, 0.5):.2f}" in card
    assert "Registered underpowered" in card and "clause 1 (delta > 0 on suite math/greedy)" in card
    assert "math/greedy\t3.00\t2.00\t1.50\tbelow min_snr 2, admitted by the config" in card
    assert env.get_template("card_bar.md.j2").render(nomination={"registration": {}}).strip() == ""


# --- power at judgement: each clause's MDE from what the comparison measured -----------------


def frame(correct: np.ndarray) -> pd.DataFrame:
    """Readout rows of a K x n outcome matrix: row r is replicate r of the n items."""
    k, n = correct.shape
    j = np.tile(np.arange(n), k)
    return pd.DataFrame(
        {
            "item_id": [f"i{x}" for x in j],
            "replicate": np.repeat(np.arange(k), n),
            "prompt_sha256": [f"p{x}" for x in j],
            "target_sha256": [f"t{x}" for x in j],
            "category": "add",
            "correct": correct.ravel().astype(bool),
        }
    )


def measured(cand: np.ndarray, ref: np.ndarray) -> dict:
    """A comparison as arenaflow.evals.compare writes it, of K x n outcome matrices."""
    from arenaflow.evals import compare

    return compare.compare(frame(cand), frame(ref), "test")


def counts(wins: int, losses: int, both: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """One replicate of n items: `wins` the candidate alone solves, `losses` the reference
    alone, `both` solved by both."""
    cand = np.zeros(n, bool)
    ref = np.zeros(n, bool)
    cand[:wins] = True
    ref[wins : wins + losses] = True
    cand[wins + losses : wins + losses + both] = ref[wins + losses : wins + losses + both] = True
    return cand[None], ref[None]


def oracle_mde(n: int, sd: float) -> float:
    d = TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8)
    return float(np.ravel(d)[0]) * sd


def test_the_measured_mde_is_statsmodels_d_times_the_measured_sd_of_the_differences():
    cand, ref = counts(wins=30, losses=10, both=80, n=200)
    comp = measured(cand, ref)
    rnd = round_([{"metric": "delta", "op": ">", "value": 1.0}], n=200, underpowered="warn")
    nom = verdicts.nominate("r", rnd, {("math", "greedy", "B", "R"): comp})
    (row,) = nom["power_measured"]["clauses"]
    sd = np.std((cand[0].astype(float) - ref[0]) * 100, ddof=1)
    assert row["n"] == 200 and row["unit"] == "items" and row["sd"] == pytest.approx(sd)
    # binary differences: SD^2 = n/(n-1) (psi - delta^2), psi 40/200, delta 20/200
    assert row["sd"] == pytest.approx(100 * np.sqrt(200 / 199 * (0.2 - 0.1**2)))
    assert row["discordance"] == pytest.approx(0.2) and row["ref_accuracy"] == pytest.approx(45)
    assert row["mde"] == pytest.approx(oracle_mde(200, sd))
    assert row["mde_planned"] == pytest.approx(power.mde(200, 0.5))  # recomputed: no plan given
    assert row["underpowered_measured"] and row["status"] == "underpowered"
    # a comparison without its clustered block: the same SD from its W/L over n items
    bare = {k: v for k, v in comp.items() if k != "clustered"}
    assert gate.measured_spread(bare, row, 1)["sd"] == pytest.approx(sd)
    assert gate.measured_spread({**bare, "replicates": 3}, row, 3)["sd"] is None
    turn = {"replicates": 1, "by_turn": {"2": {k: comp[k] for k in ("n", "wins", "losses")}}}
    assert gate.measured_spread(turn, {**row, "turn": 2}, 1)["sd"] == pytest.approx(sd)
    assert gate.measured_spread(turn, {**row, "turn": 3}, 1)["why"] == "fewer than two items"


def test_with_replicates_an_items_replicates_are_one_unit_and_its_mean_difference_counts():
    rng = np.random.default_rng(7)
    p = rng.uniform(0.1, 0.9, 60)  # each item's own difficulty: replicates are correlated
    cand = rng.random((3, 60)) < np.clip(p + 0.1, 0, 1)
    ref = rng.random((3, 60)) < p
    rnd = round_([{"metric": "delta", "op": ">=", "value": 30.0}], n=60, replicates={"greedy": 3})
    comp = measured(cand, ref)
    (row,) = verdicts.nominate("r", rnd, {("math", "greedy", "B", "R"): comp})["power_measured"][
        "clauses"
    ]
    sd = np.std((cand.astype(float) - ref).mean(axis=0) * 100, ddof=1)  # per-item means
    assert row["n"] == 60 and row["sd"] == pytest.approx(sd)
    assert row["mde"] == pytest.approx(oracle_mde(60, sd))
    assert row["underpowered_measured"] is False and row["status"] == "ok"


def test_powered_as_planned_underpowered_as_measured_is_flagged_and_the_decision_stands():
    import jinja2

    from arenaflow.rounds import report

    chat = {"suite": "chat", "metric": "delta", "op": ">", "value": 1.0}
    bar_ = [{"metric": "delta", "op": ">=", "value": 5.0}, chat, TWO_TESTS[1]]
    rnd = round_(bar_, n=200, discordance=0.05)  # "the arms rarely disagree": a small MDE
    plan = registry.register("r", rnd)["power"]  # promotion.underpowered: refuse lets it pass
    assert plan["clauses"][0]["status"] == "ok" and plan["clauses"][0]["mde"] < 5
    cand, ref = counts(wins=50, losses=30, both=60, n=200)  # they disagree on 40% of items
    comps = {(s, "greedy", "B", "R"): measured(cand, ref) for s in ("math", "chat")}
    nom = verdicts.nominate("r", rnd, comps, plan=plan)
    row, tested, test = nom["power_measured"]["clauses"]
    assert row["mde_planned"] == plan["clauses"][0]["mde"]
    assert row["mde"] > 5 and row["underpowered_measured"] and row["asks"] == 5
    assert tested["status"].startswith("tested") and tested["underpowered_measured"] is None
    assert test["status"] == "asks for no effect size" and test["mde"] == row["mde"]
    (warning,) = nom["power_measured"]["underpowered_measured"]
    assert "clause 1 (delta >= 5 on suite math/greedy)" in warning
    assert f"than the {row['mde']:.3g} points" in warning
    clause = nom["candidates"][0]["clauses"][0]
    assert clause["underpowered_measured"] and clause["mde_measured"] == row["mde"]
    # the same judgement without a power plan at all: the same verdicts and promotion
    plain = verdicts.nominate("r", {k: v for k, v in rnd.items() if k != "gating"}, comps)
    assert plain["power_measured"] is None
    holds = [c["holds"] for c in nom["candidates"][0]["clauses"]]
    assert holds == [c["holds"] for c in plain["candidates"][0]["clauses"]] == [True] * 3
    assert (nom["promoted"], nom["reason"]) == (plain["promoted"], plain["reason"])
    assert nom["promoted"] == "B"  # promoted on a bar that could not detect what it asked
    page = report.power_html(nom) + report.nomination_html(nom, {})
    assert f"<td>{row['mde']:.4g}</td>" in page and "underpowered as measured (MDE" in page
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("arenaflow", "templates"), undefined=jinja2.StrictUndefined
    )
    card = env.get_template("card_bar.md.j2").render(
        nomination={**nom, "registration": {"power": plan}}
    )
    planned, got = row["mde_planned"], row["mde"]
    line = f"1. delta on math/greedy\tB\t5.00\t{planned:.2f}\t{got:.2f}\t200 items"
    assert line in card and "Underpowered as measured (the decision stands): round r" in card
