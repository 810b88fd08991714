"""Inputs of the round rules (nomination, continual rounds, the budget table, the report page)
as functions of the resolved config; rules/common.smk wires them in, with what only Snakemake
knows (checkpoints, the budget refreshed from disk)."""

from __future__ import annotations

from arenaflow import paths, schema
from arenaflow.rounds import bar, continual


def round_needs(cfg: dict, rnd: str) -> dict:
    """compare and noise JSONs the round's bar reads, and the candidate readouts it judges."""

    def replicates_of(suite, regime):
        return cfg["evals"][suite]["regimes"][regime]["replicates"]

    return bar.requirements(cfg["rounds"][rnd], replicates_of)


def continual_walk(cfg: dict, rnd: str, nomination_of, over_budget) -> dict:
    """The nominations rounds/{rnd}.json waits on: the template's rounds up to rnd, in order, each
    asked for only once the stop rules let it run (continual.stop_reason), so a stopped round's
    jobs are never built; and why the walk stopped ('' if it did not). `nomination_of(r)`: the
    sealed nomination of round r (the checkpoint's, once it ran); `over_budget(r)`: why the
    budget refuses r, or None. A declared round: its own nomination."""
    rounds = continual.template_rounds(cfg)
    if rnd not in rounds:
        return {"nominations": [paths.nomination(rnd)], "note": ""}
    stop, noms, kept = cfg["continual"].get("stop", {}), [], []
    for i, r in enumerate(rounds[: rounds.index(rnd) + 1]):
        reason = continual.stop_reason(rounds, i, kept, stop, over_budget)
        if reason:
            return {"nominations": noms, "note": reason}
        path, nomination = nomination_of(r)
        noms.append(path)
        kept.append(nomination["promoted"] == cfg["rounds"][r]["incumbent"])
    return {"nominations": noms, "note": ""}


def over_budget(cfg: dict, budget, rnd: str) -> str | None:
    """Why the budget (arenaflow.budget.ledger.Budget, or None) refuses round `rnd`: its
    candidates with what they need cost more than is left. None when it fits or stop.budget
    is off."""
    if budget is None or not cfg["continual"].get("stop", {}).get("budget", True):
        return None
    budget.refresh()
    arms = sorted({a for c in cfg["rounds"][rnd]["candidates"] for a in budget.gate_arms(c)})
    cost, left = budget.cost(arms), budget.left()
    if cost > left:
        return (
            f"stopped: round {rnd} needs {cost:.1f} GPU-minutes, {left:.1f} are left of the budget"
        )
    return None


def declared_rounds(cfg: dict) -> list[str]:
    """The rounds the config declares (not a continual template's)."""
    return [r for r in cfg["rounds"] if not continual.is_template_round(cfg, r)]


def budget_table_inputs(cfg: dict, budget, not_started: set) -> dict:
    """The table is written last: after every admitted arm's run and every declared round's
    nomination (so the readouts it counts are on disk), and the jobs those arms cause that the
    budget reserved for them (prompt searches, guards). A continual round's arms run as its stop
    rules say, not for the table."""
    declared = declared_rounds(cfg)
    arms = {
        a
        for r in declared
        for m in [*cfg["rounds"][r]["candidates"], cfg["rounds"][r]["incumbent"]]
        if m in cfg["arms"]
        for a in budget.gate_arms(m)
    }
    ran = sorted(arms - not_started)
    searches = [s for s, ps in cfg.get("prompt_search", {}).items() if ps["arm"] not in not_started]
    return {
        "runs": [paths.run(a) for a in ran],
        "nominations": [paths.nomination(r) for r in declared],
        "searches": [paths.prompt_search(s) for s in searches],
        "guards": [paths.guard(g, a) for a in ran for g in budget.guard_files(a).values()],
    }


def round_report_inputs(cfg: dict, rnd: str) -> dict:
    """A round's page reads its nomination and registration, every regime's comparisons of its
    candidates (the sweep greedy and as served, side by side), the noise floors and the runs."""
    r = cfg["rounds"][rnd]
    s = cfg["evals"][r["suite"]]
    judged = [r["incumbent"], *r["candidates"]]
    return {
        "nomination": paths.nomination(rnd),
        "registration": paths.registration(rnd),
        "compare": [
            paths.compare(r["suite"], g, c, r["incumbent"])
            for g in s["regimes"]
            for c in r["candidates"]
        ],
        "noise": [
            paths.noise(r["suite"], g, a)
            for g, reg in s["regimes"].items()
            if reg["replicates"] >= 2
            for a in judged
        ],
        "runs": [paths.run(a) for a in judged if a != schema.BASE],
    }


def report_arm(cfg: dict, arm: dict) -> dict:
    """What a report page and a bundle card say of an arm: its init and how it was made."""
    if arm["kind"] == schema.TRAINED:
        policy = cfg["corpora"][next(iter(arm["mix"]))]["policy"]  # a mixture: its first source's
        return {"init": arm["init"], "policy": policy, "lr": arm["hyper"]["lr"]}
    if arm["kind"] == schema.NOMINEE:
        return {"init": arm["init"], "nominee": arm["round"], "parents": arm["parents"]}
    dose = {"dose": arm["dose"]} if "dose" in arm else {}
    return {"init": arm["init"], "weights": arm["merge"]["weights"], **dose}


def report_arms(cfg: dict) -> str:
    return schema.stage_json({a: report_arm(cfg, v) for a, v in cfg["arms"].items()})
