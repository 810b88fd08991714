"""A judged round in the experiment trackers (arenaflow.tracking): a parent run <lineage>/<round>
with the bar's verdict, and a child run per candidate arm with its comparison against the
incumbent and each clause's verdict (MLflow nests them; TensorBoard shows them side by side)."""

from __future__ import annotations

from arenaflow import tracking

# A candidate's numbers on the round's suite/regime (rounds.verdicts.judge: its primary compare)
NUMBERS = ("delta", "wins", "losses", "p_value", "t", "accuracy", "ref_accuracy")


def candidate_metrics(v: dict) -> dict:
    m = {f"round/{k}": v[k] for k in NUMBERS if isinstance(v.get(k), (int, float))}
    if v.get("ci95"):
        m["round/delta_ci95_low"], m["round/delta_ci95_high"] = v["ci95"]
    m["round/clears"] = float(v["clears"])
    m["round/clauses_failed"] = len(v["failed"])
    return m


def track(settings: dict | None, result: dict) -> None:
    """The nomination `result` (rounds.verdicts.nominate, sealed) as a round run and its arms'."""
    rnd = result["round"]
    common = {"round": rnd, "suite": result["suite"], "regime": result["regime"]}
    tracking.summary(
        settings,
        rnd,
        kind="round",
        params={**common, "incumbent": result["incumbent"], "bar_sha256": result["bar_sha256"]},
        tags={**common, "promoted": result["promoted"], "reason": result["reason"][:5000]},
        metrics={
            0: {
                "round/candidates": len(result["candidates"]),
                "round/cleared": sum(v["clears"] for v in result["candidates"]),
                "round/promoted_a_candidate": float(result["promoted"] != result["incumbent"]),
            }
        },
    )
    if not settings or not settings["backends"]:
        return
    # the parent first (its run exists before its children name it), then the arms together
    runs = []
    for v in result["candidates"]:
        run = tracking.open_run(
            settings,
            f"{rnd}/{v['arm']}",
            kind="round",
            tags={**common, "arm": v["arm"], "clears": v["clears"], "failed": v["failed"]},
            parent=rnd,
        )
        run.log_metrics(candidate_metrics(v), 0)
        runs.append(run)
    tracking.close_together(runs, settings["flush_s"])
