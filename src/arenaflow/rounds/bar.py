"""A round's bar: what its clauses mean, what files they need, and how one clause is judged.

No command of its own; arenaflow.config validates bars with it and arenaflow.rounds.nominate applies
them:  python -m arenaflow.rounds.nominate judge ...  (see that module).

A clause (config.schema.yaml, rounds/<id>/bar/<i>) is `metric op threshold`, where the
threshold is a number (`value`) or a multiple of a measured noise floor (`noise: {stat, times,
arm}`, read from noise/{suite}/{regime}/{arm}.json, arm defaulting to the incumbent). The
metric is read on the clause's suite and regime (default: the round's):

- paired metrics (PAIRED) come from the paired comparison of the candidate against `vs`
  (default the incumbent, or the round's `control`): delta, p_value, t (over replicates),
  t_items, wins_minus_losses, words_delta, words_t; and on an ifeval suite family_delta_min,
  the smallest per-constraint-family delta in points (arenaflow.instruct.families), a per-family
  floor
  ("no family collapsed": family_delta_min >= -5), undefined on a suite without constraints.
- level metrics (LEVELS) are one arm's rates (points) or means: without `vs` the candidate's own
  level (e.g. truncation_rate < 5); with `vs` the candidate's level minus that arm's (e.g.
  loop_rate vs control <= 2: "not worse than control by more than 2 points").

On a multi-turn suite (a pool with `turns` >= 2, arenaflow.instruct.multiturn) the comparison's
headline is "every turn passes", which a small model may never reach; `turn: k` reads a paired
per-item metric of turn k alone instead (TURN_METRICS, from the comparison's by_turn), e.g.
    - {suite: multiturn, turn: 1, metric: delta, op: ">", value: 0}

Lineage 002's v749 rule (docs/lineages.md#002-the-2x2-null-grid), with the clause that kept its
incumbent (p_value) written in:
    - {metric: delta, op: ">", value: 0}                  # a positive headline delta
    - {metric: family_delta_min, op: ">=", value: -5}     # no family collapsed
    - {suite: if_probe, metric: delta, op: ">=", value: 0}  # the probe at or above the incumbent
    - {metric: p_value, op: "<", value: 0.05}             # and not on noise

Lineage 000's "Final blocks" bar (docs/lineages.md#000-the-pre-registered-bar), as clauses (its
(4), a 5-answer spot check, is a human read):
    - {suite: chat, regime: served, metric: words_t, op: ">", value: 1.9}
    - {suite: chat, regime: served, metric: loop_rate, vs: control, op: "<=", value: 2.0}
    - {suite: chat, regime: served, metric: empty_rate, vs: control, op: "<=", value: 2.0}
    - {suite: math, regime: served, metric: delta, op: ">=",
       noise: {stat: mean_abs_delta, times: -1}}
"""

from __future__ import annotations

import json
import operator

from arenaflow import manifest, paths
from arenaflow.schema import schema_defaults

PAIRED = (
    "delta",
    "p_value",
    "t",
    "t_items",
    "wins_minus_losses",
    "words_delta",
    "words_t",
    "family_delta_min",
)
LEVELS = (
    "accuracy",
    "truncation_rate",
    "empty_rate",
    "loop_rate",
    "fffd_rate",
    "tool_leak_rate",
    "answer_usable_rate",
    "mean_words",
    "mean_tokens",
)  # what arenaflow.evals.compare.levels() returns per side
# the paired statistics the comparison keeps for each turn of a multi-turn suite (by_turn)
TURN_METRICS = ("delta", "p_value", "t_items", "wins_minus_losses")
# what `se: clustered` reads instead, from the comparison's clustered block (evals.cluster)
CLUSTERED = {"p_value": "p_value", "t_items": "t"}
NOISE_STATS = ("mean_abs_delta", "max_abs_delta", "spread", "max_abs_t")
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def bar_sha256(bar: list[dict]) -> str:
    """sha256 of a bar as canonical JSON (key order inside a clause does not matter)."""
    return manifest.sha256_text(json.dumps(bar, sort_keys=True, separators=(",", ":")))


def clauses(rnd: dict) -> list[dict]:
    """The round's bar as resolved: by arenaflow.config once for the whole workflow (the rules
    pass it in the round's JSON as `bar_resolved`), else here (a round written by hand)."""
    return rnd["bar_resolved"] if "bar_resolved" in rnd else resolve(rnd)


def resolve(rnd: dict) -> list[dict]:
    """The bar with every default made explicit and every arm named, so its sha256 changes
    when any part of its meaning does (a clause, the incumbent, the control, a default regime).
    A noise floor's `times` defaults as config.schema.yaml says (not filled into the config: the
    round is a rule param and its bar is registered as written)."""
    out = []
    for i, c in enumerate(rnd["bar"], start=1):
        vs = c.get("vs", "incumbent" if c["metric"] in PAIRED else "none")
        r = {
            "clause": i,
            "metric": c["metric"],
            "op": c["op"],
            "suite": c.get("suite", rnd["suite"]),
            "regime": c.get("regime", rnd["regime"]),
            "vs": vs,
            "against": None if vs == "none" else rnd.get(vs),
        }
        if "turn" in c:
            r["turn"] = c["turn"]
        if "value" in c:
            r["value"] = c["value"]
        else:
            noise = {**schema_defaults("noise"), **c["noise"]}
            r["noise"] = {
                "stat": noise["stat"],
                "times": noise["times"],
                "arm": noise.get("arm", rnd["incumbent"]),
            }
        for key in ("se", "admit_low_snr", "note"):  # only where given: a bar's sha256 stays
            if c.get(key) is not None:
                r[key] = c[key]
        out.append(r)
    tests = [r for r in out if r["metric"] == "p_value"]
    if len(tests) >= 2:  # a family of tests: each p is adjusted for the others (rounds.gate)
        method = (rnd.get("gating") or {}).get("promotion", {}).get("multiplicity")
        for r in tests:
            r["adjust"] = method or schema_defaults("promotion")["multiplicity"]
    return out


def validate(rnd: dict, replicates, arms: set[str], turns) -> list[tuple[str, str]]:
    """Semantic errors of a round's bar as (key under the round, message); `replicates(suite,
    regime)` gives K, or None for an unknown suite/regime; `turns(suite)` the turns of its
    conversations."""
    errors = []
    for i, c in enumerate(rnd["bar"]):
        key = f"bar/{i}"
        suite, regime = c.get("suite", rnd["suite"]), c.get("regime", rnd["regime"])
        k = replicates(suite, regime)
        if k is None:
            errors.append(
                (
                    f"{key}/{'regime' if 'regime' in c else 'suite'}",
                    f"no readout suite/regime {suite}/{regime} in evals",
                )
            )
            continue
        vs = c.get("vs")
        if vs == "none" and c["metric"] in PAIRED:
            errors.append(
                (
                    f"{key}/vs",
                    f"{c['metric']!r} is a paired metric; it needs vs: incumbent or control",
                )
            )
        if vs == "control" and "control" not in rnd:
            errors.append((f"{key}/vs", "vs: control, but the round names no control arm"))
        if "turn" in c:
            errors += _turn_errors(c, key, suite, turns(suite))
        if c.get("se") == "clustered" and (c["metric"] not in CLUSTERED or "turn" in c):
            errors.append(
                (
                    f"{key}/se",
                    f"se: clustered reads the clustered test of the whole comparison: "
                    f"{' or '.join(CLUSTERED)} without `turn`, not {c['metric']!r}",
                )
            )
        if c["metric"] == "t" and k < 2:
            errors.append(
                (
                    f"{key}/metric",
                    f"'t' is the paired t over replicates; {suite}/{regime} has "
                    f"{k} replicate (set replicates >= 2, or use t_items, the t over items)",
                )
            )
        if "noise" in c:
            if k < 2:
                errors.append(
                    (
                        f"{key}/noise",
                        f"a noise floor needs >= 2 replicates; {suite}/{regime} has {k}",
                    )
                )
            if c["noise"].get("arm", rnd["incumbent"]) not in arms:
                errors.append((f"{key}/noise/arm", f"unknown arm {c['noise']['arm']!r}"))
    return errors


def _turn_errors(c: dict, key: str, suite: str, turns: int) -> list[tuple[str, str]]:
    if turns < 2:
        return [(f"{key}/turn", f"suite {suite!r} is not multi-turn (its pool has 1 turn)")]
    if c["turn"] > turns:
        return [(f"{key}/turn", f"turn {c['turn']}: suite {suite!r} has {turns} turns")]
    if c["metric"] not in TURN_METRICS:
        return [
            (
                f"{key}/metric",
                f"{c['metric']!r} is not kept per turn; a turn clause reads one of "
                f"{', '.join(TURN_METRICS)}",
            )
        ]
    return []


def comparisons_needed(rnd: dict) -> list[tuple[str, str, str, str]]:
    """(suite, regime, candidate, reference) of every comparison the round reads, primary first."""
    need = []
    for cand in rnd["candidates"]:
        need.append((rnd["suite"], rnd["regime"], cand, rnd["incumbent"]))
        for c in clauses(rnd):
            need.append((c["suite"], c["regime"], cand, c["against"] or rnd["incumbent"]))
    return list(dict.fromkeys(need))


def requirements(rnd: dict, replicates) -> dict[str, list[str]]:
    """Paths the judgement reads: compare and noise JSONs, and the candidates' readouts (whose
    creation times the registration must precede)."""
    need = comparisons_needed(rnd)
    noise = [(c["suite"], c["regime"], c["noise"]["arm"]) for c in clauses(rnd) if "noise" in c]
    noise += snr_noise(rnd, replicates)
    readouts = [
        paths.readout(s, cand, r, k)
        for s, r, cand in dict.fromkeys((s, r, c) for s, r, c, _ in need)
        for k in range(replicates(s, r))
    ]
    return {
        "compare": [paths.compare(s, r, c, ref) for s, r, c, ref in need],
        "noise": [paths.noise(s, r, a) for s, r, a in dict.fromkeys(noise)],
        "readouts": readouts,
    }


def snr_noise(rnd: dict, replicates) -> list[tuple[str, str, str]]:
    """(suite, regime, incumbent) of the noise floors a signal-to-noise admission reads
    (promotion.min_snr, arenaflow.rounds.gate): every gating suite/regime with K >= 2."""
    if (rnd.get("gating") or {}).get("promotion", {}).get("min_snr") is None:
        return []
    pairs = dict.fromkeys((c["suite"], c["regime"]) for c in clauses(rnd))
    return [(s, r, rnd["incumbent"]) for s, r in pairs if replicates(s, r) >= 2]


def _level(comp: dict, side: str, metric: str):
    if "levels" in comp:
        return comp["levels"][side][metric]
    if metric == "accuracy":  # comparisons without the structural battery still carry accuracy
        return comp["accuracy" if side == "cand" else "ref_accuracy"]
    raise KeyError(metric)


def judge_clause(clause: dict, cand: str, incumbent: str, compares: dict, noises: dict) -> dict:
    """One resolved clause for one candidate: the observed number, the threshold and the verdict.
    A number that is undefined (a t with zero variance, a missing level) never holds."""
    s, r, m = clause["suite"], clause["regime"], clause["metric"]
    ref = clause["against"] or incumbent
    comp = compares[(s, r, cand, ref)]
    why = None
    try:
        if "turn" in clause:  # JSON keeps by_turn's keys as strings
            observed = comp["by_turn"][str(clause["turn"])][m]
        elif clause.get("se") == "clustered":
            observed = comp["clustered"]["clustered"][CLUSTERED[m]]
        elif m in PAIRED:
            observed = comp[m]
        elif clause["vs"] == "none":
            observed = _level(comp, "cand", m)
        else:
            observed = _level(comp, "cand", m) - _level(comp, "ref", m)
    except KeyError:
        what = f"turn {clause['turn']}'s {m}" if "turn" in clause else m
        observed, why = None, f"{what} is not in the comparison {cand} vs {ref} on {s}/{r}"
    out = {k: v for k, v in clause.items()}
    if "noise" in clause:
        nz = clause["noise"]
        floor = noises[(s, r, nz["arm"])].get(nz["stat"])
        out["threshold"] = None if floor is None else nz["times"] * floor
        out["threshold_from"] = f"{nz['times']:g} x {nz['stat']} of {paths.noise(s, r, nz['arm'])}"
        if floor is None:
            why = why or f"the noise floor's {nz['stat']} is undefined"
    else:
        out["threshold"] = clause["value"]
    if observed is None and why is None:
        why = f"{m} is undefined for {cand} vs {ref} on {s}/{r}"
    holds = why is None and bool(OPS[clause["op"]](observed, out["threshold"]))
    out.update(observed=observed, holds=holds)
    if why:
        out["undefined"] = why
    return out


def describe(c: dict) -> str:
    """'clause 2: loop_rate vs R2d on math/served = 4.4 <= 2 fails' for reasons and tables."""
    lhs = (f"turn {c['turn']} " if "turn" in c else "") + c["metric"]
    lhs += f" vs {c['against']}" if c.get("against") else ""
    obs = "undefined" if c["observed"] is None else f"{c['observed']:.4g}"
    thr = "undefined" if c["threshold"] is None else f"{c['threshold']:.4g}"
    if "p_raw" in c:  # a p adjusted for the bar's other p_value clauses (rounds.gate.adjust)
        obs += f" ({c['adjust']}-adjusted; raw {c['p_raw']:.4g})"
    return (
        f"clause {c['clause']}: {lhs} on {c['suite']}/{c['regime']} = {obs} {c['op']} {thr} "
        f"{'holds' if c['holds'] else 'fails'}"
    )
