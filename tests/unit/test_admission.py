"""Admission under the GPU-minute cap as Slurm's GrpTRESMins (arenaflow.budget.admission): arms
start
in priority order while they fit, cumulatively with what earlier runs spent; a refused arm is
recorded and dropped from its round, the rest of the lineage runs; the budget table."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_budget import e2e_config, evidence, snakemake_dry

from arenaflow import config as afconfig
from arenaflow import paths
from arenaflow.budget import admission
from arenaflow.budget import ledger as afbudget
from arenaflow.budget import plan as afplan
from arenaflow.evals import readout_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests/e2e"))
from dagrun import planned_jobs  # noqa: E402

R2D_LINE = ["R220", "R2d", "S1"]  # the incumbent of round r3 and its lineage


def cap_for(tmp_path, arms, slack=0.05, **budget):
    """A budget whose cap fits exactly `arms` (pending) plus `slack` GPU-minutes."""
    b = afbudget.Budget(e2e_config(tmp_path, {"gpu_minutes": 1e9, **budget}))
    return b.cost(arms) + b.settings["spent_gpu_minutes"] + slack


def test_arms_start_in_priority_order_while_they_fit_and_the_rest_are_refused(tmp_path):
    cap = cap_for(tmp_path / "a", [*R2D_LINE, "B1", "B2"])
    cfg = e2e_config(tmp_path, {"gpu_minutes": cap})
    b = afbudget.Budget(cfg)
    d = admission.admit(b)
    admitted = sorted(a for a, v in d.items() if v["status"] == admission.ADMITTED)
    assert admitted == sorted([*R2D_LINE, "B1", "B2"])
    # B3 would need its own training and readouts (the corpus rft_r3 is sampled for B1 already)
    e3 = b.estimate("B3")
    assert d["B3"]["status"] == admission.REFUSED
    assert d["B3"]["gpu_minutes"] == pytest.approx(e3.own)
    assert (
        "AssocGrpGRESMinutes" in d["B3"]["reason"]
        and f"{e3.own:.1f} GPU-minutes" in d["B3"]["reason"]
    )
    assert d["soup"]["status"] == admission.BLOCKED and "B3" in d["soup"]["reason"]  # B2 + B3
    # what was admitted fits under the cap, and together with B3 it would not
    assert b.cost(admitted) <= cap - b.spent()["total"] + 1e-9
    assert b.cost([*admitted, "B3"]) > cap - b.spent()["total"]
    # the continual template's arms are left to its stop rules
    assert not any(a.startswith(("r4-", "r5-", "r3-nominee")) for a in d)


def test_a_higher_priority_arm_is_admitted_before_the_config_order(tmp_path):
    cap = cap_for(tmp_path / "a", [*R2D_LINE, "B1"])
    cfg = e2e_config(tmp_path, {"gpu_minutes": cap}, arm_overrides={"B4": {"priority": 5}})
    d = admission.admit(afbudget.Budget(cfg))
    assert d["B4"]["status"] == admission.ADMITTED and d["B1"]["status"] == admission.REFUSED


def test_the_cap_is_cumulative_across_runs(tmp_path):
    # the first run spent S1, R220 and R2d (measured from their evidence) and 2 GPU-minutes
    # before these results; the cap leaves room for one more B-arm only
    cfg = e2e_config(tmp_path, {"gpu_minutes": 1e9, "spent_gpu_minutes": 2.0})
    results = tmp_path / "results"
    for arm in R2D_LINE:
        evidence(results, arm, wall=30.0, steps=4, hyper=cfg["arms"][arm]["hyper"])
    b = afbudget.Budget(cfg, results=results)
    spent = b.spent()["total"]
    assert spent == pytest.approx(2.0 + b.spent()["training_measured"] + 0.0)
    cap = spent + b.cost(["B1"]) + 0.05
    cfg["budget"]["gpu_minutes"] = cap
    d = admission.admit(afbudget.Budget(cfg, results=results))
    assert [d[a]["status"] for a in R2D_LINE] == [admission.RAN] * 3
    assert d["B1"]["status"] == admission.ADMITTED
    assert {d[a]["status"] for a in ("B2", "B3", "B4")} == {admission.REFUSED}


def test_refused_arms_leave_their_round_and_the_table_records_them(tmp_path):
    cap = cap_for(tmp_path / "a", [*R2D_LINE, "B1", "B2"])
    cfg = e2e_config(tmp_path, {"gpu_minutes": cap})
    b = afbudget.Budget(cfg)
    d = admission.admit(b)
    rounds = copy.deepcopy(cfg["rounds"])
    notes = admission.drop_refused(cfg, d)
    assert cfg["rounds"]["r3"]["candidates"] == ["B1", "B2"]
    assert rounds["r3"]["candidates"][:4] == ["B1", "B2", "B3", "B4"]
    assert any("round r3 judges without B3 (AssocGrpGRESMinutes" in n for n in notes)
    t = admission.table(b)
    assert t["cap_gpu_minutes"] == pytest.approx(cap)
    assert t["refused"] == sorted(a for a, v in d.items() if v["status"] != admission.ADMITTED)
    rows = {r["arm"]: r for r in t["arms"]}
    assert rows["B3"]["estimate"] == pytest.approx(b.estimate("B3").own + b.estimate("B3").sampling)
    md = admission.markdown(t)
    assert f"GPU-minute cap {cap:.1f}" in md and "| B3 | rft_r3 | refused |" in md


def test_the_workflow_runs_the_lineage_without_the_refused_arms(tmp_path):
    cap = cap_for(tmp_path / "a", [*R2D_LINE, "B1", "B2"])
    # the table waits for round r3's nomination (config.yaml's continual rounds after r3 stop by
    # their own rules, so they are not asked for here)
    proc = snakemake_dry(tmp_path, "budget/table.json", {"gpu_minutes": cap})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    jobs = planned_jobs(proc)
    trained = sorted(w.split("=")[1] for r, w in jobs if r == "train_arm")
    assert trained == sorted([*R2D_LINE, "B1", "B2"])
    assert ("budget_table", "") in jobs and ("nominate", "rnd=r3") in jobs
    assert "round r3 judges without B3 (AssocGrpGRESMinutes" in out
    # asking for a refused arm itself is still refused whole, before anything runs
    proc = snakemake_dry(tmp_path, "runs/B3/final", {"gpu_minutes": cap})
    assert proc.returncode != 0 and "arm 'B3' would overrun the budget" in proc.stdout + proc.stderr


def test_plan_says_which_arms_the_workflow_starts_and_which_it_does_not(tmp_path):
    from arenaflow.budget import plan as afplan

    cap = cap_for(tmp_path / "a", [*R2D_LINE, "B1", "B2"])
    b = afbudget.Budget(e2e_config(tmp_path, {"gpu_minutes": cap}))
    text = afplan.render(afplan.plan(b))
    line = text.splitlines()[-1]
    starts, _, rest = line.partition("; does not start: ")
    assert set(starts.split(": ")[1].split()) == {*R2D_LINE, "B1", "B2"}
    assert {"B3", "B4", "soup"} <= set(rest.split())


def test_a_job_process_keeps_the_main_processes_refusals_when_costs_have_moved(tmp_path):
    # the main process refuses B3 and B4; then the lineage's arms finish far cheaper than their
    # estimates, so deciding again would admit B3: a job process (which re-parses the workflow
    # later, under Slurm) must still judge the round the main process planned
    cap = cap_for(tmp_path / "a", [*R2D_LINE, "B1", "B2"], slack=0.5)
    cfg = e2e_config(tmp_path, {"gpu_minutes": cap, "estimate": {"overhead_minutes": 1.0}})
    results = tmp_path / "results"
    first = admission.admit(afbudget.Budget(cfg, results=results))
    env = admission.to_env(first)
    assert {"B3", "B4"} <= set(env.split(","))
    for arm in [*R2D_LINE, "B1"]:
        evidence(results, arm, wall=0.1, steps=1, hyper={**cfg["arms"][arm]["hyper"], "nproc": 1})
    later = afbudget.Budget(cfg, results=results)
    assert admission.admit(later)["B3"]["status"] == admission.ADMITTED  # costs moved
    job = admission.from_env(env, later)
    assert admission.not_started(job) == admission.not_started(first)
    assert job["B1"]["status"] == admission.RAN and job["B2"]["status"] == admission.ADMITTED
    main_cfg, job_cfg = copy.deepcopy(cfg), copy.deepcopy(cfg)
    admission.drop_refused(main_cfg, first)
    admission.drop_refused(job_cfg, job)
    assert job_cfg["rounds"] == main_cfg["rounds"]
    # the budget table this run writes says what the run started with, with the refusal's
    # numbers, not what deciding again now would admit (the H200 run of config/seeds/003-gpu
    # showed smk 'admitted' though its run had refused it)
    t = admission.table(later, first)
    rows = {r["arm"]: r for r in t["arms"]}
    assert (
        rows["B3"]["status"] == admission.REFUSED and "AssocGrpGRESMinutes" in rows["B3"]["reason"]
    )
    assert rows["B1"]["status"] == admission.RAN and rows["B2"]["status"] == admission.ADMITTED
    assert t["refused"] == sorted(admission.not_started(first))
    assert admission.table(later)["refused"] != t["refused"]  # deciding again would differ


# ---- the jobs an arm causes: prompt-search readouts and MC guards (lineage 003) -----------


def lineage003(tmp_path):
    raw, _ = afconfig.load_configs(
        [str(REPO / "config/seeds/003.yaml")], [f"results_dir={tmp_path / 'results'}"]
    )
    return afconfig.resolve(raw)


def test_an_arms_estimate_holds_the_search_readouts_and_guard_runs_it_causes(tmp_path):
    cfg = lineage003(tmp_path)
    b = afbudget.Budget(cfg)
    est, suite = cfg["budget"]["estimate"], cfg["evals"]["ifeval"]
    over, step = est["overhead_minutes"], est["decode_step_seconds"]
    # prompt_search k reads LA2b200 under k0, k0h, k0m and none: four readouts of the 60-item
    # IF pool at 48 new tokens, each ceil(60 / batch) batches of 48 decode steps
    batches = -(-cfg["pools"]["if_eval"]["n"] // suite["batch_size"])
    one = batches * 48 * step / 60 + over
    items = [
        json.loads(x) for x in (REPO / "data/mc/arith_facts.jsonl").read_text().split("\n") if x
    ]
    guard = sum(len(it["choices"]) for it in items) * step / 60 + over  # a pass per choice
    e = b.estimate("LA2b200")
    assert e.search == pytest.approx(4 * one) and e.guards == pytest.approx(guard)
    assert e.own == pytest.approx(e.train + e.readouts + 4 * one + guard)
    assert b.estimate("LA2b100").search == b.estimate("LA2b100").guards == 0.0  # causes neither
    # in the cost that admission compares with the cap
    assert b.cost(["LA2b200"]) - b.cost(["LA2b100"]) == pytest.approx(
        e.own - b.estimate("LA2b100").own
    )
    # and in their own columns of `python -m arenaflow.budget.plan`'s listing
    head, *rows = afplan.render(afplan.plan(b)).split("\n\n")[1].splitlines()
    cols = head.split()
    la = dict(zip(cols, next(r for r in rows if r.startswith("LA2b200")).split()))
    assert (la["search"], la["guards"]) == (f"{4 * one:.1f}", f"{guard:.1f}")


def test_once_they_ran_they_count_as_measured_and_the_table_shows_them(tmp_path):
    cfg = lineage003(tmp_path)
    results = tmp_path / "results"
    over = cfg["budget"]["estimate"]["overhead_minutes"]
    evidence(results, "LA2b200", wall=60.0, steps=4, hyper=cfg["arms"]["LA2b200"]["hyper"])
    frame = pd.DataFrame({"item_id": ["i0"], "correct": [True]})
    for k, seconds in {"none": 30.0, "k0": 45.0}.items():  # two of the four searched so far
        path = results / paths.readout("ifeval", "LA2b200", f"greedy-{k}", 0)
        readout_file.write_readout(frame, path, {"seconds": seconds})
    (results / "guards/mc").mkdir(parents=True)
    (results / "guards/mc/LA2b200.json").write_text(json.dumps({"seconds": 12.0}))
    b = afbudget.Budget(cfg, results=results)
    spent = b.spent()
    assert spent["search_readouts_measured"] == pytest.approx(30 / 60 + 45 / 60 + 2 * over)
    assert spent["mc_guards_measured"] == pytest.approx(12 / 60 + over)
    assert spent["total"] == pytest.approx(
        spent["before"]
        + spent["training_measured"]
        + spent["generation_estimated"]
        + spent["search_readouts_measured"]
        + spent["mc_guards_measured"]
    )
    # still to run: the other two readouts of the search, at the estimate
    assert b.searched("LA2b200", on_disk=False) == pytest.approx(
        b.readout("ifeval", "greedy-k0h") + b.readout("ifeval", "greedy-k0m")
    )
    t = admission.table(b)
    row = {r["arm"]: r for r in t["arms"]}["LA2b200"]
    assert row["status"] == admission.RAN
    assert row["search_readouts"] == pytest.approx(spent["search_readouts_measured"])
    assert row["mc_guards"] == pytest.approx(spent["mc_guards_measured"])
    assert row["cost"] == pytest.approx(
        row["training_measured"]
        + row["readouts_estimated"]
        + row["search_readouts"]
        + 12 / 60
        + over
    )
    md = admission.markdown(t)
    assert "| of which prompt-search readouts | of which MC guards |" in md
    assert f"| {row['search_readouts']:.1f} | {row['mc_guards']:.1f} |" in md
    assert f"MC guards measured {spent['mc_guards_measured']:.1f}" in md
    # a pending arm's row shows its estimate of them
    smk = {r["arm"]: r for r in t["arms"]}["smk"]
    assert (smk["search_readouts"], smk["mc_guards"]) == (0.0, 0.0)


def test_a_guard_on_an_unknown_arm_is_named(tmp_path):
    raw, _ = afconfig.load_configs(
        [str(REPO / "config/seeds/003.yaml")], [f"results_dir={tmp_path / 'results'}"]
    )
    raw["mc_guards"]["mc"]["arms"] = ["LA2b200", "LA9"]
    with pytest.raises(afconfig.ConfigError, match=r"mc_guards/mc/arms'.*\['LA9'\]"):
        afconfig.resolve(raw)
