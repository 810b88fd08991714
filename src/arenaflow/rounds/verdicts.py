"""A round's bar applied: each candidate's verdict per clause and the arm the round promotes.

Consumes the round's config section and its compare (and noise) JSONs keyed by (suite, regime,
candidate, reference); produces the nomination record that arenaflow.rounds.nominate seals.
"""

from __future__ import annotations

from arenaflow.rounds import bar, gate
from arenaflow.rounds.bar import bar_sha256


def _key(rnd: dict, k) -> tuple:
    # {candidate: comparison vs the incumbent on the round's suite/regime} is shorthand
    return (rnd["suite"], rnd["regime"], k, rnd["incumbent"]) if isinstance(k, str) else tuple(k)


def judge(
    candidate: str, rnd: dict, compares: dict, noises: dict | None = None, snrs: dict | None = None
) -> dict:
    """One candidate's verdict: every clause judged, its p_value clauses adjusted together
    (gate.adjust) and, with promotion.min_snr, those on a suite not admitted failed (gate.admit)."""
    primary = compares[(rnd["suite"], rnd["regime"], candidate, rnd["incumbent"])]
    clauses = [
        bar.judge_clause(c, candidate, rnd["incumbent"], compares, noises or {})
        for c in bar.clauses(rnd)
    ]
    clauses = gate.admit(gate.adjust(clauses), rnd, snrs or gate.snr(rnd, compares, noises or {}))
    return {
        "arm": candidate,
        "clears": all(c["holds"] for c in clauses),
        "clauses": clauses,
        "failed": [c["clause"] for c in clauses if not c["holds"]],
        **{
            k: primary.get(k)
            for k in (
                "delta",
                "wins",
                "losses",
                "p_value",
                "ci95",
                "t",
                "t_items",
                "accuracy",
                "ref_accuracy",
            )
        },
    }


def promote(verdicts: list[dict], incumbent: str) -> tuple[str, dict | None, list[dict]]:
    """(promoted arm, its verdict or None, the verdicts that clear): the largest delta among
    those that clear, the first listed of equal deltas; else the incumbent."""
    cleared = [v for v in verdicts if v["clears"]]
    if not cleared:
        return incumbent, None, cleared
    best = max(cleared, key=lambda v: v["delta"])  # max keeps the first of equal deltas
    return best["arm"], best, cleared


def nominate(
    round_id: str,
    rnd: dict,
    comparisons: dict,
    noises: dict | None = None,
    plan: dict | None = None,
) -> dict:
    """comparisons: {(suite, regime, cand, ref): compare JSON}, or {cand: compare JSON vs the
    incumbent on the round's suite/regime}; noises: {(suite, regime, arm): noise JSON}; plan:
    the power plan registered with the bar (gate.power_plan's, recomputed when None), beside
    which each clause's MDE as measured is recorded (gate.measured_power)."""
    compares = {_key(rnd, k): v for k, v in comparisons.items()}
    missing = sorted(
        {
            f"{c} vs {ref} on {s}/{r}"
            for s, r, c, ref in bar.comparisons_needed(rnd)
            if (s, r, c, ref) not in compares
        }
    )
    if missing:
        raise ValueError(f"round {round_id}: no comparison for {missing}")
    snrs = gate.snr(rnd, compares, noises or {})
    verdicts = [judge(c, rnd, compares, noises, snrs) for c in rnd["candidates"]]
    measured = gate.measured_power(
        round_id, rnd, compares, plan if plan is not None else gate.power_plan(round_id, rnd)
    )
    verdicts = gate.mark_measured(verdicts, measured)  # evidence only: no verdict changes
    promoted, best, cleared = promote(verdicts, rnd["incumbent"])
    where = f"{rnd['suite']}/{rnd['regime']}"
    if best:
        reason = (
            f"{promoted} clears every clause with the largest delta among "
            f"{len(cleared)} that clear ({best['delta']:+.2f} pt vs {rnd['incumbent']} on {where})"
        )
    else:
        fails = "; ".join(
            f"{v['arm']} fails "
            + ", ".join(bar.describe(c) for c in v["clauses"] if not c["holds"])
            for v in verdicts
        )
        reason = f"no candidate clears the bar; the incumbent {promoted} stays ({fails})"
    resolved = bar.clauses(rnd)
    return {
        "round": round_id,
        "suite": rnd["suite"],
        "regime": rnd["regime"],
        "incumbent": rnd["incumbent"],
        "control": rnd.get("control"),
        "bar": rnd["bar"],
        "bar_resolved": resolved,
        "bar_sha256": bar_sha256(resolved),
        "candidates": verdicts,
        "promoted": promoted,
        "reason": reason,
        "snr": gate.admission(rnd, snrs),
        "min_snr": (rnd.get("gating") or {}).get("promotion", {}).get("min_snr"),
        "power_measured": measured,
    }
