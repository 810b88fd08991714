"""What a bar can detect, how its p-values are adjusted, and which suites may gate on it.

No command of its own (docs/statistics.md gives the method and its references):

- power_plan: at registration, each gating suite's minimum detectable effect (MDE, points) at
  promotion.power and promotion.alpha (arenaflow.evals.power) from its item count and the
  planning accuracy and discordance of promotion; a clause that asks for less is
  `underpowered` (arenaflow.rounds.registry refuses it, or records a warning). The measured
  noise floor is not there to use: registration precedes every readout of the round.
- measured_power / mark_measured: at nomination, each checked clause's MDE again from what was
  measured: the units (clusters; an item with its replicates by default) of the comparison the
  clause reads and the SD of their differences (arenaflow.evals.power.mde_of_sd). A clause that
  asks for less is flagged `underpowered_measured`; the decision is not changed (the rules were
  fixed at registration), the flag is evidence for the report and the card.
- adjust: a candidate's p_value clauses adjusted together (statsmodels' multipletests, the
  method bar.resolve wrote into each clause as `adjust`); the decision reads the adjusted p.
- snr / admit: each gating suite/regime's signal-to-noise ratio, the range of the round's arms'
  accuracies over the range of the incumbent's replicate accuracies (its noise floor's spread),
  and, with promotion.min_snr, the clauses of a suite below it fail as not admitted.

Config resolution (arenaflow.config) writes what these need into the round as `gating`: the
filled promotion section and, per suite, its item count (None when only the built pool knows
it), replicates per regime and gate_below_snr.
"""

from __future__ import annotations

import math

from arenaflow.evals import power as afpower
from arenaflow.rounds import bar

SIGNIFICANCE = {"p_value": "<", "t": ">", "t_items": ">"}  # a test on the suite, not an effect


def gating_of(cfg: dict, rnd: dict, promotion: dict) -> dict:
    """The round's `gating` record (see the module docstring) from a resolved config."""
    suites = {}
    for c in bar.resolve(rnd):  # only what the bar reads: the round is its jobs' param
        ev = cfg["evals"][c["suite"]]
        s = suites.setdefault(
            c["suite"],
            {
                "n": cfg["pools"][ev["pool"]].get("n"),
                "replicates": {},
                "gate_below_snr": bool(ev.get("gate_below_snr", False)),
            },
        )
        s["replicates"][c["regime"]] = ev["regimes"][c["regime"]]["replicates"]
    return {"promotion": promotion, "suites": suites}


def _asks(c: dict, n: int, k: int) -> float | None:
    """The effect (points, signed) a clause asks for, or None when it asks for none."""
    if "value" not in c or c["op"] not in (">", ">="):
        return None
    if c["metric"] == "delta" or (c["metric"] == "accuracy" and c["vs"] != "none"):
        return float(c["value"])
    if c["metric"] == "wins_minus_losses":  # W - L over the n x K pooled rows
        return 100.0 * c["value"] / (n * k)
    return None


def _tested(rnd: dict) -> set[tuple[str, str]]:
    """The suite/regimes on which a significance clause controls the noise."""
    return {
        (c["suite"], c["regime"])
        for c in bar.clauses(rnd)
        if SIGNIFICANCE.get(c["metric"]) == c["op"].rstrip("=")
    }


def power_plan(round_id: str, rnd: dict) -> dict | None:
    """The MDE of each gating suite and each clause's standing against it; None for a round
    without `gating` (one written by hand)."""
    g = rnd.get("gating")
    if not g:
        return None
    prom = g["promotion"]
    p = prom["parent_accuracy"] / 100
    psi = prom.get("discordance") or afpower.planning_discordance(p)
    tested = _tested(rnd)
    plan = {
        **{k: prom[k] for k in ("power", "alpha", "parent_accuracy")},
        "on_underpowered": prom["underpowered"],
        "discordance": psi,
        "basis": "planning values of promotion (registration precedes the readouts)",
        "suites": {},
        "clauses": [],
        "underpowered": [],
    }
    for c in bar.clauses(rnd):
        s, r = c["suite"], c["regime"]
        n, k = g["suites"][s]["n"], g["suites"][s]["replicates"][r]
        mde = None if not n or n < 2 else afpower.mde(n, psi, prom["alpha"], prom["power"])
        plan["suites"][f"{s}/{r}"] = {"n": n, "replicates": k, "mde": mde}
        row = {"clause": c["clause"], "suite": s, "regime": r, "metric": c["metric"], "mde": mde}
        asks = None if mde is None else _asks(c, n, k)
        if mde is None:
            row["status"] = "not checked: the suite's size is known only once its pool is built"
        elif asks is None:
            row["status"] = "asks for no effect size"
        elif (s, r) in tested:
            row.update(asks=asks, status="tested: a significance clause on the suite controls it")
        else:
            row.update(asks=asks, status="ok" if abs(asks) >= mde else "underpowered")
        if row["status"] == "underpowered":
            plan["underpowered"].append(
                f"round {round_id}: clause {c['clause']} ({c['metric']} {c['op']} "
                f"{c['value']:g} on suite {s}/{r}) asks for an effect of {asks:.3g} points, less "
                f"than the suite's minimum detectable effect {mde:.3g} points ({n} items, parent "
                f"accuracy {prom['parent_accuracy']:g}, discordance {psi:.3g}, power "
                f"{prom['power']:g}, alpha {prom['alpha']:g}): it would pass or fail on noise"
            )
        plan["clauses"].append(row)
    return plan


def _block(comp: dict, clause: dict) -> dict:
    """The paired numbers a clause reads: its turn's on a turn clause, else the comparison's."""
    return comp.get("by_turn", {}).get(str(clause["turn"]), {}) if "turn" in clause else comp


def measured_spread(comp: dict, clause: dict, k: int) -> dict:
    """What the comparison a clause reads measured: {"n": its independent units, "unit",
    "sd": the SD (points) of the units' differences, or None with "why"}. From the clustered
    block, sd = SE x sqrt(G) over its G clusters, so that the t of TTestPower (df = G - 1,
    noncentrality delta / SE) is the clustered test the comparison ran; without it (a turn's
    numbers, a comparison from before clusters) and with one row per item (K = 1), the SD of the
    +1/-1/0 differences its wins and losses over n items imply."""
    cl = None if "turn" in clause else comp.get("clustered")
    if cl and cl["clustered"].get("se") is not None:
        g = cl["n_clusters"]
        unit = "items" if cl["cluster_by"] == "item" else "clusters"
        return {"n": g, "unit": unit, "sd": cl["clustered"]["se"] * math.sqrt(g)}
    block = _block(comp, clause)
    n = block.get("n")
    why = (
        "fewer than two items"
        if not n or n < 2
        else "no wins and losses in the comparison"
        if "wins" not in block
        else "no clustered block, and K rows per item are not independent"
        if comp.get("replicates", k) != 1
        else None
    )
    if why:
        return {"n": n, "unit": "items", "sd": None, "why": why}
    w, lo = block["wins"], block["losses"]
    var = (w + lo - (w - lo) ** 2 / n) / (n - 1)  # sample variance (ddof 1) of the differences
    return {"n": n, "unit": "items", "sd": 100 * math.sqrt(max(var, 0.0))}


def _measured_row(
    c: dict, cand: str, comp: dict, k: int, planned: dict, tested: bool, prom: dict
) -> dict:
    """One clause for one candidate: its asked effect against the MDE of what was measured."""
    sp = measured_spread(comp, c, k)
    block = _block(comp, c)
    rows = block.get("n")
    psi = (block["wins"] + block["losses"]) / rows if rows and "wins" in block else None
    row = {
        **{key: c[key] for key in ("clause", "suite", "regime", "metric")},
        "candidate": cand,
        "mde_planned": planned.get("mde"),
        "planned_status": planned.get("status"),
        **{key: sp[key] for key in ("n", "unit", "sd")},
        "ref_accuracy": block.get("ref_accuracy"),
        "discordance": psi,  # measured: the share of rows on which the arms disagree
        "mde": None,
        "underpowered_measured": None,
    }
    if not sp["sd"]:
        row["status"] = "not measured: " + sp.get("why", "the arms agree on every unit (SD 0)")
        return row
    row["mde"] = afpower.mde_of_sd(sp["n"], sp["sd"], prom["alpha"], prom["power"])
    asks = _asks(c, rows, 1)  # W - L over the comparison's pooled rows
    if asks is None:
        row["status"] = "asks for no effect size"
    elif tested:
        row.update(asks=asks, status="tested: a significance clause on the suite controls it")
    else:
        row.update(asks=asks, underpowered_measured=abs(asks) < row["mde"])
        row["status"] = "underpowered" if row["underpowered_measured"] else "ok"
    return row


def measured_power(round_id: str, rnd: dict, compares: dict, plan: dict | None) -> dict | None:
    """Each clause's MDE per candidate from the comparison it reads, beside the MDE registered
    in `plan` (power_plan's); None for a round without `gating`."""
    g = rnd.get("gating")
    if not g:
        return None
    prom, tested = g["promotion"], _tested(rnd)
    planned = {row["clause"]: row for row in (plan or {}).get("clauses", [])}
    out = {
        "power": prom["power"],
        "alpha": prom["alpha"],
        "basis": "measured at nomination: the SD of the differences of each clause's comparison "
        "over its units (docs/statistics.md, power at judgement)",
        "clauses": [],
        "underpowered_measured": [],
    }
    for c in bar.clauses(rnd):
        s, r = c["suite"], c["regime"]
        ref = c["against"] or rnd["incumbent"]
        k, plan_row = g["suites"][s]["replicates"][r], planned.get(c["clause"], {})
        for cand in rnd["candidates"]:
            comp = compares[(s, r, cand, ref)]
            row = _measured_row(c, cand, comp, k, plan_row, (s, r) in tested, prom)
            out["clauses"].append(row)
            if row["underpowered_measured"]:
                out["underpowered_measured"].append(_measured_warning(round_id, c, row, ref, prom))
    return out


def _measured_warning(round_id: str, c: dict, row: dict, ref: str, prom: dict) -> str:
    planned = "unknown" if row["mde_planned"] is None else f"{row['mde_planned']:.3g}"
    return (
        f"round {round_id}: clause {c['clause']} ({c['metric']} {c['op']} {c['value']:g} on "
        f"suite {c['suite']}/{c['regime']}) asks for an effect of {row['asks']:.3g} points, less "
        f"than the {row['mde']:.3g} points its test detects on what {row['candidate']} vs {ref} "
        f"measured ({row['n']} {row['unit']}, SD of the differences {row['sd']:.3g} pt, power "
        f"{prom['power']:g}, alpha {prom['alpha']:g}; registered MDE {planned} points): the bar "
        "could not detect the effect it asked for"
    )


def mark_measured(verdicts: list[dict], measured: dict | None) -> list[dict]:
    """Each judged clause with its planned and measured MDE and `underpowered_measured`; its
    verdict (`holds`) is left as judged."""
    if not measured:
        return verdicts
    rows = {(row["candidate"], row["clause"]): row for row in measured["clauses"]}
    for v in verdicts:
        for c in v["clauses"]:
            row = rows[(v["arm"], c["clause"])]
            c.update(
                mde_planned=row["mde_planned"],
                mde_measured=row["mde"],
                underpowered_measured=row["underpowered_measured"],
            )
    return verdicts


def adjust(judged: list[dict]) -> list[dict]:
    """The judged clauses with the p_value family adjusted (bar.resolve marks its members with
    `adjust`): each keeps p_raw and p_adjusted, and holds on the adjusted p."""
    fam = [c for c in judged if "adjust" in c and c["observed"] is not None]
    if not fam:
        return judged
    # statsmodels takes ~2 s to import: not at the import of what config resolution loads
    from statsmodels.stats.multitest import multipletests

    _, padj, _, _ = multipletests([c["observed"] for c in fam], method=fam[0]["adjust"])
    for c, p in zip(fam, padj):
        c.update(p_raw=c["observed"], p_adjusted=float(p), observed=float(p))
        c["holds"] = "undefined" not in c and bool(bar.OPS[c["op"]](c["observed"], c["threshold"]))
    return judged


def snr_of(accuracies: dict, noise: dict | None) -> dict:
    """Signal (range of the arms' accuracies, points) over noise (the noise floor's spread)."""
    acc = [a for a in accuracies.values() if a is not None]
    signal = max(acc) - min(acc) if len(acc) >= 2 else None
    spread = None if noise is None else noise.get("spread")
    snr = signal / spread if signal is not None and spread else None
    why = (
        "no noise floor read (K = 1, or promotion.min_snr unset: the judgement reads a gating "
        "suite's noise floor only for admission)"
        if noise is None
        else "the noise floor's spread is 0"
        if not spread
        else "fewer than two arms read out"
        if signal is None
        else None
    )
    return {"arms": accuracies, "signal": signal, "noise": spread, "snr": snr, "why": why}


def snr(rnd: dict, compares: dict, noises: dict) -> dict:
    """{"suite/regime": snr_of(...)} of every suite/regime the bar gates on, from the candidates'
    comparisons against the incumbent there and the incumbent's noise floor."""
    out = {}
    inc = rnd["incumbent"]
    for s, r in dict.fromkeys((c["suite"], c["regime"]) for c in bar.clauses(rnd)):
        accs = {}
        for cand in rnd["candidates"]:
            comp = compares.get((s, r, cand, inc))
            if comp:
                accs[cand], accs[inc] = comp.get("accuracy"), comp.get("ref_accuracy")
        out[f"{s}/{r}"] = snr_of(accs, noises.get((s, r, inc)))
    return out


def admit(judged: list[dict], rnd: dict, snrs: dict) -> list[dict]:
    """With promotion.min_snr: a clause on a suite/regime whose SNR is below it (or undefined)
    fails as not admitted, unless the clause or its suite says it may gate anyway."""
    g = rnd.get("gating") or {}
    floor = g.get("promotion", {}).get("min_snr")
    if floor is None:
        return judged
    for c in judged:
        key = f"{c['suite']}/{c['regime']}"
        got = snrs[key]["snr"]
        if got is not None and got >= floor:
            continue
        if c.get("admit_low_snr") or g["suites"][c["suite"]]["gate_below_snr"]:
            c["admitted_below_snr"] = True
            continue
        shown = "undefined (" + str(snrs[key]["why"]) + ")" if got is None else f"{got:.3g}"
        c["holds"] = False
        c["undefined"] = c.get("undefined") or (
            f"suite {key} is not admitted as a gating suite: its SNR {shown} is below "
            f"promotion.min_snr {floor:g}"
        )
    return judged


def admission(rnd: dict, snrs: dict) -> dict:
    """snrs with each suite/regime's standing as a gating suite, for the nomination and card."""
    g = rnd.get("gating") or {}
    floor = g.get("promotion", {}).get("min_snr")
    out = {}
    for key, v in snrs.items():
        s = key.split("/")[0]
        exempt = g.get("suites", {}).get(s, {}).get("gate_below_snr") or any(
            c.get("admit_low_snr") for c in bar.clauses(rnd) if f"{c['suite']}/{c['regime']}" == key
        )
        if floor is None:
            state = "reported; no promotion.min_snr is set"
        elif v["snr"] is not None and v["snr"] >= floor:
            state = f"admitted (SNR >= {floor:g})"
        elif exempt:
            state = f"below min_snr {floor:g}, admitted by the config"
        else:
            state = f"not admitted (SNR below {floor:g}): its clauses fail"
        out[key] = {**v, "admission": state}
    return out


def snr_errors(rnd: dict) -> list[tuple[str, str]]:
    """Config errors: with min_snr, every gating suite/regime not exempt needs a noise floor."""
    g = rnd.get("gating") or {}
    if g.get("promotion", {}).get("min_snr") is None:
        return []
    errors = []
    for i, c in enumerate(bar.resolve(rnd)):
        k = g["suites"][c["suite"]]["replicates"][c["regime"]]
        exempt = c.get("admit_low_snr") or g["suites"][c["suite"]]["gate_below_snr"]
        if k < 2 and not exempt:
            errors.append(
                (
                    f"bar/{i}",
                    f"promotion.min_snr needs a noise floor of {c['suite']}/{c['regime']}, "
                    f"which has {k} replicate: set replicates >= 2, or admit_low_snr: true on "
                    f"the clause, or gate_below_snr: true on the suite",
                )
            )
    return errors
