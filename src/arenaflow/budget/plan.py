"""Which pending arms to run under the GPU-minute budget.

    python -m arenaflow.budget.plan                                   # config/config.yaml
    python -m arenaflow.budget.plan --configfile tests/e2e/config.yaml \\
        --config results_dir=/tmp/r --gpu-minutes 120 [--json]

Config files are merged as Snakemake merges them: over config/config.yaml unless one names
another file, or none, as `merge_over` (arenaflow.config.load_configs).

Lists every pending arm (no runs/{arm}/final yet) with its estimate (arenaflow.budget.ledger:
training,
readouts, the sampling of its corpus), the budget and what is left of it, and picks the arms to
run with an integer program (pulp, CBC):

    maximise   sum_a priority_a x_a   (then, among equal priority, the cheaper set)
    subject to sum_a (train_a + readouts_a) x_a + sum_c sampling_c y_c <= left
               x_a <= x_d   for every pending arm d that a needs (its init, its corpus's policy)
               x_a <= y_c   when a's corpus c still has to be sampled (sampled once, shared)
               x, y binary

An arm's priority is `priority:` in its file (arm.schema.yaml; default 1, higher first). The
chosen arms are the targets to ask for: `snakemake runs/B1/final ...`. A run that asks for more
is refused before anything is submitted (rules/common.smk).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import pulp

from arenaflow import config as afconfig
from arenaflow import paths
from arenaflow import schema as afschema
from arenaflow.budget import admission as afadmission
from arenaflow.budget import cost as afcost
from arenaflow.budget import ledger as afbudget
from arenaflow.config import cli
from arenaflow.corpora.coverage import binary, cbc

STATUSES = (afadmission.ADMITTED, afadmission.REFUSED, afadmission.BLOCKED)
TIE = 1e-6  # the cost tie-break is worth less than this much priority


def choose(estimates: dict[str, afcost.ArmEstimate], left: float) -> set[str]:
    """The set of arms of maximal total priority whose cost fits in `left` (see module doc)."""
    arms = sorted(estimates)
    if not arms:
        return set()
    samp: dict[str, float] = {}
    for e in estimates.values():  # a mixture's arm may need several corpora sampled
        for c, m in e.sampled().items():
            samp[c] = max(samp.get(c, 0.0), m)
    corpora = sorted(samp)
    total = sum(e.own for e in estimates.values()) + sum(samp.values())
    eps = TIE / (1.0 + total)
    left = total if math.isinf(left) else left  # no budget: everything fits
    prob = pulp.LpProblem("arenaflow_plan", pulp.LpMaximize)
    x = {a: binary(prob, f"x_{i}") for i, a in enumerate(arms)}
    y = {c: binary(prob, f"y_{i}") for i, c in enumerate(corpora)}
    cost = pulp.lpSum(estimates[a].own * x[a] for a in arms) + pulp.lpSum(
        samp[c] * y[c] for c in corpora
    )
    prob += pulp.lpSum(estimates[a].priority * x[a] for a in arms) - eps * cost
    prob += cost <= max(left, 0.0), "budget"
    for a in arms:
        e = estimates[a]
        for d in e.needs:
            if d in x:
                prob += x[a] <= x[d], f"needs_{a}_{d}"
            else:  # a pending dependency outside the candidates: cannot run
                prob += x[a] == 0, f"blocked_{a}_{d}"
        for j, c in enumerate(e.sampled()):
            prob += x[a] <= y[c], f"corpus_{a}_{j}"
    status = prob.solve(cbc())
    if pulp.LpStatus[status] != "Optimal":
        raise RuntimeError(f"the integer program is {pulp.LpStatus[status]}")
    return {a for a in arms if x[a].value() > 0.5}


def plan(b: afbudget.Budget) -> dict:
    pending = b.pending_arms()
    ests = {a: b.estimate(a) for a in pending}
    spent = b.spent()
    total = b.settings["gpu_minutes"]
    left = total - spent["total"]
    chosen = choose(ests, left) if pending else set()
    row_s, row_src = b.row_seconds()
    return {
        "budget_gpu_minutes": total,
        "spent": spent,
        "left": left,
        "row_seconds": row_s,
        "row_seconds_from": row_src,
        "pending": [{**vars(e), "own": e.own, "chosen": a in chosen} for a, e in ests.items()],
        "chosen": sorted(chosen),
        "chosen_cost": b.cost(chosen),
        "all_cost": b.cost(pending),
        # what the workflow itself will start: arm by arm in priority order
        # (arenaflow.budget.admission)
        "admission": afadmission.admit(b),
    }


def render(p: dict) -> str:
    lines = [
        f"budget {p['budget_gpu_minutes']:.1f} GPU-minutes; spent {p['spent']['total']:.1f} "
        f"({afadmission.spent_line(p)}); left {p['left']:.1f}",
        f"step time: {p['row_seconds']:.4f} s per 1024-token row per rank "
        f"({p['row_seconds_from']})",
        "",
    ]
    if not p["pending"]:
        return "\n".join([*lines, "no pending arms: every arm has runs/{arm}/final"])
    head = tuple(
        "arm prio gpus rows steps train readouts search guards corpus sampling needs run".split()
    )
    rows = [
        (
            e["arm"],
            f"{e['priority']:g}",
            str(e["gpus"]),
            str(e["rows"]),
            str(e["steps"]),
            f"{e['train']:.1f}",
            f"{e['readouts']:.1f}",
            *(f"{e[k]:.1f}" if e[k] else "-" for k in ("search", "guards")),
            e["corpus"],
            f"{e['sampling']:.1f}" if e["sampling"] else "-",
            ",".join(e["needs"]) or "-",
            "yes" if e["chosen"] else "no",
        )
        for e in p["pending"]
    ]
    width = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, width)).rstrip())
    lines += [
        "",
        f"all pending arms: {p['all_cost']:.1f} GPU-minutes (a corpus is sampled once)",
        f"chosen: {' '.join(p['chosen']) or '(none)'}: {p['chosen_cost']:.1f} of {p['left']:.1f} "
        "GPU-minutes left",
    ]
    if p["chosen"]:
        lines.append("run: snakemake " + " ".join(paths.run(a) for a in p["chosen"]))
    by = {st: [a for a, d in p["admission"].items() if d["status"] == st] for st in STATUSES}
    lines.append(
        "the workflow (GrpTRESMins, by priority) starts: "
        + (" ".join(by[afadmission.ADMITTED]) or "(none)")
        + "; does not start: "
        + (" ".join(by[afadmission.REFUSED] + by[afadmission.BLOCKED]) or "(none)")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Pending arms, their GPU-minute estimates and the ones "
        "to run under the budget (an integer program)."
    )
    cli.add_arguments(ap)
    ap.add_argument(
        "--gpu-minutes", type=float, default=None, help="the budget (default: budget.gpu_minutes)"
    )
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    args = ap.parse_args(argv)
    try:
        cfg, _ = cli.resolved(args)
    except afconfig.ConfigError as e:
        print(f"arenaflow config error: {e}", file=sys.stderr)
        return 1
    if "budget" not in cfg and args.gpu_minutes is None:
        print(
            "no budget: set budget.gpu_minutes in the config or pass --gpu-minutes", file=sys.stderr
        )
    b = afbudget.Budget(
        cfg, results=afschema.REPO_ROOT / cfg["results_dir"], gpu_minutes=args.gpu_minutes
    )
    p = plan(b)
    print(json.dumps(p, indent=2, default=str) if args.json else render(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
