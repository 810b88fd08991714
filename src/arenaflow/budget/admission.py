"""Admission under the GPU-minute cap, arm by arm, as Slurm's GrpTRESMins does it, and the
budget table of a lineage's report.

    python -m arenaflow.budget.admission --config-json '{...}' --results . \\
        --out budget/table.json --md budget/table.md

Lineage 003 (docs/lineages.md#003-the-gpu-minute-budget) ran into its association's
GrpTRESMins gres/gpu cap: a cap on the GPU-minutes of all the association's jobs, past,
present and future, summed. Slurm applies it job by job: a job whose GPU-minutes would take the
association over the cap is not started (reason AssocGrpGRESMinutes), the jobs that fit still
run, and a job that depends on a refused one never starts. Here an arm is the job (its
training, its readouts and the sampling of its corpora: arenaflow.budget.ledger's estimate). With a
`budget:` in the config, the workflow admits arms before the DAG is built (rules/common.smk):

  in order of priority (higher first; then the config's arm order), each pending arm is
  admitted with whatever it requires that is not yet admitted (its pending lineage, and for a
  round's candidate the round's incumbent and control with theirs) when their cost fits in
  what is left of the cap after everything admitted before it; otherwise it is refused
  (AssocGrpGRESMinutes). An arm that requires a refused arm is blocked (Slurm's
  DependencyNeverSatisfied).

A refused or blocked arm is dropped from its rounds' candidates and the rest of the lineage
runs; the budget table (budget/table.json and .md, rule budget_table) records the cap, what was
spent before, what each arm cost (its training measured from its evidence, its readouts and
sampling estimated, as arenaflow.budget.ledger counts them), and each refusal with its numbers. A
target that asks for a refused arm itself is still refused whole, before anything is submitted
(the train rule's budget gate). Slurm's Safe enforcement reserves a job's whole time limit when
it starts; the estimate plays that part here. The main Snakemake process decides once and passes
the arms it did not admit to its jobs (ENV), so a job process re-parsing the workflow later judges
the rounds it planned.
"""

from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

from arenaflow import io, knobs, paths
from arenaflow import schema as afschema
from arenaflow.budget import cost as afcost
from arenaflow.budget import ledger as afbudget
from arenaflow.rounds import continual

ADMITTED, RAN, REFUSED, BLOCKED = "admitted", "ran", "refused", "blocked"
REASON = "AssocGrpGRESMinutes"
ENV = knobs.NOT_ADMITTED  # the main process's refusals, passed to its jobs


def declared_rounds(cfg: dict) -> dict:
    """The rounds the config declares; a continual template's rounds run as its stop rules say
    (arenaflow.rounds.continual stops before a round the budget cannot pay for)."""
    return {r: v for r, v in cfg["rounds"].items() if not continual.is_template_round(cfg, r)}


def admissible(cfg: dict) -> list[str]:
    """The arms admission decides on, in config order: all but a continual template's arms and
    the nominees it continues."""
    template = {
        c
        for r, v in cfg["rounds"].items()
        if r not in declared_rounds(cfg)
        for c in v["candidates"]
    }
    return [
        a for a, v in cfg["arms"].items() if a not in template and v["kind"] != afschema.NOMINEE
    ]


def requires(b: afbudget.Budget, arm: str) -> list[str]:
    """The pending arms `arm` cannot be judged without: its lineage, and for each round that has
    it as a candidate the round's incumbent and control with their lineages."""
    arms = b.cfg["arms"]
    out = list(arms[arm]["lineage"])
    for rnd in declared_rounds(b.cfg).values():
        if arm in rnd["candidates"]:
            for a in (rnd["incumbent"], rnd.get("control")):
                if a in arms:
                    out += [a, *arms[a]["lineage"]]
    return [a for a in dict.fromkeys(out) if a in arms and b.pending(a) and a != arm]


def admit(b: afbudget.Budget) -> dict[str, dict]:
    """{arm: decision} for every arm of the config: ran (not pending), admitted, refused or
    blocked, in the order they were decided (see the module doc)."""
    arms = admissible(b.cfg)
    left = b.left()
    out = {a: {"status": RAN} for a in arms if not b.pending(a)}
    admitted: list[str] = []
    order = sorted((a for a in arms if b.pending(a)), key=lambda a: (-b.priority(a), arms.index(a)))
    for arm in order:
        if arm in out:
            continue
        group = [a for a in requires(b, arm) if a not in admitted] + [arm]
        stuck = [a for a in group if out.get(a, {}).get("status") in (REFUSED, BLOCKED)]
        if stuck:
            out[arm] = {"status": BLOCKED, "reason": f"requires {', '.join(stuck)}, not started"}
            continue
        before = b.cost(admitted)
        need = b.cost(admitted + group) - before
        if need <= left - before + 1e-9:
            for a in group:
                out[a] = {
                    "status": ADMITTED,
                    "gpu_minutes": b.cost(admitted + [a]) - b.cost(admitted),
                }
                admitted.append(a)
            continue
        out[arm] = {
            "status": REFUSED,
            "reason": (
                f"{REASON}: needs {need:.1f} GPU-minutes"
                + (f" with {', '.join(group[:-1])}" if len(group) > 1 else "")
                + f", {left - before:.1f} of the cap's {b.settings['gpu_minutes']:.1f} left"
            ),
            "gpu_minutes": need,
        }
    return {a: out[a] for a in arms}


def to_env(decisions: dict) -> str:
    """The arms not admitted, as the main process passes them to its jobs (ENV)."""
    return ",".join(sorted(not_started(decisions)))


def from_env(value: str, b: afbudget.Budget) -> dict:
    """A job process's decisions: the main process's refusals (to_env), every other admissible
    arm as it stands now."""
    gone = set(filter(None, value.split(",")))
    return {
        a: {"status": REFUSED, "reason": "not admitted by the main process"}
        if a in gone
        else {"status": RAN if not b.pending(a) else ADMITTED}
        for a in admissible(b.cfg)
    }


def not_started(decisions: dict) -> set[str]:
    return {a for a, d in decisions.items() if d["status"] in (REFUSED, BLOCKED)}


def drop_refused(cfg: dict, decisions: dict) -> list[str]:
    """Remove refused and blocked arms from the rounds' candidates (in place); a round left
    with none is removed. Returns one line per change, for the log."""
    gone, notes = not_started(decisions), []
    for rid, rnd in declared_rounds(cfg).items():
        dropped = [c for c in rnd["candidates"] if c in gone]
        if not dropped:
            continue
        rnd["candidates"] = [c for c in rnd["candidates"] if c not in gone]
        notes.append(
            f"budget: round {rid} judges without "
            + "; ".join(f"{c} ({decisions[c]['reason']})" for c in dropped)
        )
        if not rnd["candidates"]:
            del cfg["rounds"][rid]
            notes.append(f"budget: round {rid} has no candidate left and does not run")
    return notes


def arm_row(b: afbudget.Budget, arm: str, decision: dict) -> dict:
    """One arm's line of the table: its GPUs, steps, estimate and, once it ran, its measured
    training and the readouts on disk."""
    a = b.cfg["arms"][arm]
    row = {"arm": arm, "kind": a["kind"], "corpus": a["corpus"], **decision}
    if decision["status"] != RAN:
        e = b.estimate(arm)
        row.update(
            gpus=e.gpus,
            steps=e.steps,
            estimate=e.own + e.sampling,
            search_readouts=e.search,
            mc_guards=e.guards,
        )
        return row
    over = b.est["overhead_minutes"]
    ev_path = b.results / paths.run(arm) / "training_evidence.json"
    ev = io.read_json(ev_path) if ev_path.exists() else None
    train = afcost.record_minutes(ev, over) if ev else 0.0
    reads = sum(b.readout(s, g) for s, g, p in b.readout_files(arm) if p.exists())
    # the jobs it caused, as they ran: prompt-search readouts and MC guards on disk
    search, guards = b.searched(arm, on_disk=True), b.guarded(arm, on_disk=True)
    row.update(
        gpus=(ev or {}).get("world_size", 1 if ev is None else None),
        steps=(ev or {}).get("optimizer_steps", 0),
        training_measured=train,
        readouts_estimated=reads,
        search_readouts=search,
        mc_guards=guards,
        cost=train + reads + search + guards,
        job_id=(ev or {}).get("job_id"),
    )
    return row


def table(b: afbudget.Budget, decided: dict | None = None) -> dict:
    """The cap, what was spent and each arm's row. `decided`: the decisions this run started
    with (the main process's, with their numbers); an arm they admitted is shown as it stands
    now, ran or still pending. Without them the arms are decided again from the results on
    disk, where measured costs can admit an arm this run refused."""
    if decided is None:
        decisions = admit(b)
    else:
        decisions = {
            a: d if d["status"] in (REFUSED, BLOCKED) else {"status": ADMITTED}
            for a, d in decided.items()
        }
        decisions = {
            a: {"status": RAN} if d["status"] == ADMITTED and not b.pending(a) else d
            for a, d in decisions.items()
        }
    spent = b.spent()
    return {
        "cap_gpu_minutes": b.settings["gpu_minutes"],
        "spent": spent,
        "left": b.settings["gpu_minutes"] - spent["total"],
        "rule": "GrpTRESMins: an arm that would take the total over the cap is not started",
        "arms": [arm_row(b, a, d) for a, d in decisions.items()],
        "refused": sorted(not_started(decisions)),
    }


def spent_line(t: dict) -> str:
    """What was spent, by kind of job (the budget's spent())."""
    s = t["spent"]
    return (
        f"before these results {s['before']:.1f}; training measured "
        f"{s['training_measured']:.1f} over {s['runs']} runs; readouts and sampling estimated "
        f"{s['generation_estimated']:.1f}; prompt-search readouts measured "
        f"{s.get('search_readouts_measured', 0.0):.1f}; MC guards measured "
        f"{s.get('mc_guards_measured', 0.0):.1f}"
    )


def caused(r: dict) -> tuple[str, str]:
    """An arm's prompt-search readouts and MC guards, as the table shows them ('-' for none)."""
    return tuple(f"{r[k]:.1f}" if r.get(k) else "-" for k in ("search_readouts", "mc_guards"))


def markdown(t: dict) -> str:
    lines = [
        f"GPU-minute cap {t['cap_gpu_minutes']:.1f}; spent {t['spent']['total']:.1f} "
        f"({spent_line(t)}); left {t['left']:.1f}.",
        "",
        "| arm | corpus | status | GPUs | steps | GPU-minutes | of which prompt-search readouts "
        "| of which MC guards | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in t["arms"]:
        minutes = r.get("cost", r.get("estimate", 0.0))
        what = "measured+est." if r["status"] == RAN else "estimate"
        search, guards = caused(r)
        lines.append(
            f"| {r['arm']} | {r['corpus'] or '-'} | {r['status']} | {r.get('gpus') or '-'} | "
            f"{r.get('steps', '-')} | {minutes:.1f} ({what}) | {search} | {guards} | "
            f"{r.get('reason', '')} |"
        )
    lines += ["", f"Refused or blocked: {', '.join(t['refused']) or 'none'}."]
    return "\n".join(lines) + "\n"


def html_page(t: dict) -> str:
    """The table as a page of `snakemake --report` (refused and blocked rows in red)."""
    e, s = html.escape, t["spent"]
    rows = "".join(
        f"<tr class={'no' if r['status'] in (REFUSED, BLOCKED) else 'ok'}>"
        f"<th>{e(r['arm'])}</th><td>{e(r['corpus'] or '-')}</td><td>{e(r['status'])}</td>"
        f"<td>{r.get('gpus') or '-'}</td><td>{r.get('steps', '-')}</td>"
        f"<td>{r.get('cost', r.get('estimate', 0.0)):.1f}"
        f"{' (measured + estimated)' if r['status'] == RAN else ' (estimate)'}</td>"
        + "".join(f"<td>{c}</td>" for c in caused(r))
        + f"<td>{e(r.get('reason', ''))}</td></tr>\n"
        for r in t["arms"]
    )
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>GPU-minute budget</title>\n'
        "<style>body{font-family:sans-serif} td,th{border:1px solid #ccc;padding:4px 8px}\n"
        "table{border-collapse:collapse} .ok{background:#e8f5e9} .no{background:#ffebee}"
        "</style></head><body>\n"
        f"<h2>GPU-minute cap {t['cap_gpu_minutes']:.1f}: spent {s['total']:.1f}, "
        f"left {t['left']:.1f}</h2>\n"
        f"<p>Spent: {e(spent_line(t))}. {e(t['rule'])}.</p>\n"
        "<table><tr><th>arm</th><th>corpus</th><th>status</th><th>GPUs</th><th>steps</th>"
        "<th>GPU-minutes</th><th>of which prompt-search readouts</th>"
        f"<th>of which MC guards</th><th>note</th></tr>\n{rows}</table></body></html>\n"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="The budget table: cap, cost per arm, refusals.")
    ap.add_argument(
        "--config-json", required=True, help="the workflow's config as resolved, as JSON"
    )
    ap.add_argument("--results", default=".", help="the results directory")
    ap.add_argument("--out", required=True, help="budget/table.json")
    ap.add_argument("--md", required=True, help="budget/table.md")
    ap.add_argument("--html", required=True, help="budget/table.html (a page of --report)")
    ap.add_argument(
        "--decisions-json",
        default=None,
        help="the decisions the run started with (admit's, as JSON): what it refused",
    )
    args = ap.parse_args(argv)
    cfg = json.loads(args.config_json)
    if "budget" not in cfg:
        raise SystemExit("the config has no budget: section; there is no table to write")
    decided = json.loads(args.decisions_json) if args.decisions_json else None
    t = table(afbudget.Budget(cfg, results=Path(args.results)), decided)
    io.write_json(args.out, t)
    io.write_text(args.md, markdown(t))
    io.write_text(args.html, html_page(t))
    print(markdown(t))


if __name__ == "__main__":
    main()
