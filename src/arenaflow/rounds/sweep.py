"""A round's learning-rate sweep: its candidates in LR order and what the deltas say.

Consumes the round's config section, the arms' {init, policy, lr} and the compare JSONs against
the incumbent; produces the LR order, a reading of the sweep (best arm, bracketed or at an edge,
unimodal) and that reading in words, for the round's page and the bundle's model card.
"""

from __future__ import annotations


def sweep_order(candidates: list[str], arms: dict) -> list[str]:
    """Trained candidates by learning rate (the sweep's dose), then as listed; merges, which
    have no learning rate, after them (their own page: merges.png)."""
    lr = lambda a: arms.get(a, {}).get("lr") or 0.0  # noqa: E731
    merged = lambda a: "weights" in arms.get(a, {})  # noqa: E731
    return sorted(candidates, key=lambda a: (merged(a), lr(a), candidates.index(a)))


def lr_text(lr: float) -> str:
    """A learning rate as a sweep names it: 2.5e-04, 1e-05 (one digit would print 2.5e-4 as
    2e-04 and 2.5e-3 as 3e-03)."""
    return f"{lr:.1e}".replace(".0e", "e")


def sweep_reading(rnd: dict, arms: dict, compares: dict) -> dict | None:
    """The round's LR sweep read as lineage 000 read its own (docs/lineages.md#000-the-lr-sweep):
    its trained candidates in LR order with their delta on the round's suite and regime, the
    best of them, and whether the sweep brackets it (an arm at a lower and at a higher LR) or
    leaves it at an end, where the sweep has not shown the response turning. None with fewer
    than three learning rates, or candidates of different inits or corpus policies (not one
    sweep)."""
    lrs = {
        a: arms[a]["lr"]
        for a in rnd["candidates"]
        if arms.get(a, {}).get("lr") and "weights" not in arms[a] and (rnd["regime"], a) in compares
    }
    sources = {(arms[a].get("init"), arms[a].get("policy")) for a in lrs}
    if len(set(lrs.values())) < 3 or len(sources) > 1:
        return None
    order = sweep_order(list(lrs), arms)
    deltas = [compares[(rnd["regime"], a)]["delta"] for a in order]
    i = deltas.index(max(deltas))  # a tie: the lowest LR
    lo, hi = lrs[order[0]], lrs[order[-1]]
    edge = "lowest" if lrs[order[i]] == lo else "highest" if lrs[order[i]] == hi else None
    return {
        "order": order,
        "lr": [lrs[a] for a in order],
        "delta": deltas,
        "best": order[i],
        "tied": [a for a, d in zip(order, deltas) if d == deltas[i]],  # the best and its equals
        "edge": edge,
        "unimodal": all(a <= b for a, b in zip(deltas[:i], deltas[1 : i + 1]))
        and all(a >= b for a, b in zip(deltas[i:], deltas[i + 1 :])),
    }


def sweep_sentence(r: dict) -> str:
    """sweep_reading's verdict in words, as the round's page and the bundle's card say it."""
    best_lr = r["lr"][r["order"].index(r["best"])]
    if len(r["tied"]) > 1:
        best = r["delta"][r["order"].index(r["best"])]
        verdict = (
            f"{', '.join(r['tied'][:-1])} and {r['tied'][-1]} tie for the best ({best:+.2f} pt): "
            "the sweep does not single out one learning rate."
        )
    elif r["edge"]:
        side = "below" if r["edge"] == "lowest" else "above"
        verdict = (
            f"The best, {r['best']}, is at the sweep's {r['edge']} LR ({lr_text(best_lr)}): the "
            f"sweep does not bracket its peak; an arm {side} it would show whether the response "
            "turns."
        )
    else:
        verdict = f"The best, {r['best']} (lr {lr_text(best_lr)}), lies inside the sweep."
    return f"{verdict} The response is {'unimodal' if r['unimodal'] else 'not unimodal'}."
