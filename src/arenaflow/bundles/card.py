"""The bundle's model card, README.md, from templates/model_card.md.j2.

Consumes the served arm's lineage (its runs' evidence and corpora stats), the compare JSONs the
card reports and the nominating round's sweep; writes README.md into the assembled bundle.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2

from arenaflow import io, manifest, paths
from arenaflow.bundles.sources import MERGE, TRAINING, evidence_corpora, evidence_file
from arenaflow.decode import sampling
from arenaflow.rounds import sweep


def card_context(args, arm: str, lineage: list[str], nomination: dict | None) -> dict:
    runs, corpora = Path(args.runs), Path(args.corpora)
    training, corpus_ids = [], []
    for a in reversed([arm, *lineage]):
        run = paths.run_under(runs, a)
        if evidence_file(run) == MERGE:
            training.append(_merge_row(a, io.read_json(run / MERGE)))
            continue
        ev = io.read_json(run / TRAINING)
        if "mixture" in ev:  # the rows trained on, from each source
            rows = sum(s["rows"] for s in ev["mixture"])
        else:
            rows = io.read_json(corpora / ev["corpus"] / "stats.json")["rows"]
        training.append(
            {
                "arm": a,
                "method": ev["hyperparameters"]["method"],
                "init": ev["init"],
                "corpus": ev["corpus"],
                "rows": rows,
                "steps": ev["optimizer_steps"],
                "lr": ev["hyperparameters"]["lr"],
                "job": ev["job_id"],
            }
        )
        corpus_ids += evidence_corpora(ev)
    corpora_ctx = []
    for c in dict.fromkeys(corpus_ids):
        st = io.read_json(corpora / c / "stats.json")
        corpora_ctx.append(
            {
                "id": c,
                "digest": io.read_json(corpora / c / "manifest.json")["digest"],
                "pass_at_1": st.get("pass_at_1"),
                **{
                    k: st.get(k)
                    for k in (
                        "rows",
                        "tokens",
                        "supervised_tokens",
                        "solved",
                        "prompts",
                        "unsolved_dropped",
                    )
                },
            }
        )
    from arenaflow.evals.compare import finite_record  # pandas: only when a card is written

    evaluations = []
    for path in (
        args.compare
    ):  # written by `arenaflow.evals.compare compare`, which records its suite and regime
        c = finite_record(io.read_json(path), path)
        evaluations.append({**c, "suite": f"{c['suite']}/{c['regime']}"})
    return {
        "training": training,
        "corpora": corpora_ctx,
        "evaluations": evaluations,
        "nomination": nomination,
        "sweep": card_sweep(nomination, json.loads(args.arms_json or "{}")),
        "lineage": list(reversed([arm, *lineage])),
    }


def card_sweep(nomination: dict | None, arms: dict) -> dict | None:
    """The nominating round's LR sweep, read as the round report reads it, for the card's 'why this
    learning rate' section (lineage 000's card gives its sweep so): its candidates in LR order
    with their sealed deltas, W/L and p, and the reading. `arms`: {arm: {init, policy, lr}} as
    configured. None without a nomination or a sweep of three learning rates."""
    if not nomination:
        return None
    cands = {c["arm"]: c for c in nomination["candidates"]}
    rnd = {"candidates": list(cands), "regime": nomination["regime"]}
    r = sweep.sweep_reading(rnd, arms, {(rnd["regime"], a): c for a, c in cands.items()})
    if r is None:
        return None
    return {
        "rows": [{**cands[a], "lr": sweep.lr_text(lr)} for a, lr in zip(r["order"], r["lr"])],
        "init": arms[r["best"]].get("init"),
        "policy": arms[r["best"]].get("policy"),
        "reading": sweep.sweep_sentence(r),
    }


def _merge_row(arm: str, ev: dict) -> dict:
    """A merge in the card's training table: its weights in place of an init, no corpus."""
    made = " + ".join(f"{p['weight']:g} x {p['arm']}" for p in ev["parents"])
    return {
        "arm": arm,
        "method": f"merge ({ev['representation']})",
        "init": made,
        "corpus": "none",
        "rows": 0,
        "steps": 0,
        "lr": "-",
        "job": "CPU",
        "merge": ev,
    }


def write_card(
    tmp: Path, bundle: str, arm: str, evidence: dict, serving: dict, tok, checks: dict, ctx: dict
) -> None:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("arenaflow", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    card = env.get_template("model_card.md.j2").render(
        bundle=bundle,
        arm=arm,
        evidence=evidence,
        code=manifest.code_version(),
        serving=serving,
        eos_ids=sampling.stop_token_ids(tok),
        checks=checks,
        **ctx,
    )
    io.write_text(tmp / "README.md", card)
