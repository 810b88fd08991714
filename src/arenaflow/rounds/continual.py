"""Continual rounds: each round's policy is the last round's nominee.

Two config features, both turned into plain config before anything else is resolved, so every
later check (unknown names, cycles, the bar) sees ordinary pools, corpora, arms and rounds:

- A nominee reference, `{nominee: r3}`, wherever an arm is named as a corpus's `policy`, an arm's
  `init` or a round's `incumbent`: the arm round r3 promotes, or its incumbent when it promotes
  nobody. It becomes an arm of its own, `r3-nominee` (kind NOMINEE), whose run (rule
  `nominee_run`) is a copy of the promoted arm's weights, made once r3's sealed nomination
  exists. Every job that uses it therefore waits on the nomination, and `snakemake -n` shows it
  waiting (a checkpoint would hide the next round until the nomination ran).
- A round template, config key `continual`: one round declared once (its pool, corpus keys, an
  arm grid in a directory of arm files, the bar) and instantiated `rounds` times after round
  `after`: round r4's pool is a fresh slice (seed + i, excluding every earlier pool), its
  corpus is sampled by r3's nominee, its arms start from r3's nominee, its incumbent is r3's
  nominee. Ids: round r4, pool r4-pool, corpus r4-corpus, arms r4-<arm file stem>.

Stopping rules (`continual.stop`), applied between rounds by `rounds/{round}.json`
(rules/continual.smk, `stop_reason`): after the template's N rounds; after M rounds in a row that
kept their incumbent; and before a round whose pending GPU-minutes exceed what is left of the
budget (arenaflow.budget.ledger), so that round's jobs are never submitted.
"""

from __future__ import annotations

from pathlib import Path

from arenaflow import paths
from arenaflow.schema import NOMINEE, round_ids


def stop_reason(
    rounds: list[str], index: int, kept: list[bool], stop: dict, over_budget
) -> str | None:
    """Why the template's round `rounds[index]` does not run, or None. `kept`: for each earlier
    template round, whether it kept its incumbent; `over_budget(rnd)`: a message when the round's
    pending GPU-minutes exceed what is left, else None."""
    m = stop.get("after_kept_rounds")
    if m and len(kept) >= m and all(kept[-m:]):
        streak = ", ".join(rounds[index - m : index])
        return f"stopped: {m} round(s) in a row kept their incumbent ({streak})"
    return over_budget(rounds[index])


def template_rounds(cfg: dict) -> list[str]:
    t = cfg.get("continual")
    return [] if not t else round_ids(t["after"], t["rounds"], "continual", ValueError)


def is_template_round(cfg: dict, rnd: str) -> bool:
    return rnd in template_rounds(cfg)


# ---- jobs ------------------------------------------------------------------------------------
ALIAS = "nominee.json"


def write_nominee(rnd: str, nomination: str, runs: Path, out: Path) -> dict:
    """runs/{round}-nominee/final: the promoted arm's weights (hard links where the filesystem
    allows), and nominee.json naming the arm and the sealed nomination. Only a sealed nomination
    whose judged files are unchanged is followed, and only a run whose manifest verifies."""
    from arenaflow import io, manifest
    from arenaflow.bundles import sources
    from arenaflow.rounds import nominate

    nom = nominate.load_sealed(nomination, root=".")
    promoted = nom["promoted"]
    if promoted == "base":
        raise SystemExit(
            f"round {rnd} kept 'base', which has no weights for a nominee reference to use"
        )
    src = paths.run_under(runs, promoted)
    record = manifest.require(src, f"round {rnd}'s nominee")
    real = io.read_json(src / ALIAS)["arm"] if (src / ALIAS).exists() else promoted
    with io.atomic_dir(out) as tmp:
        for f in sources.weight_files(src):
            _link_or_copy(src / f, tmp / f)
        io.write_json(
            tmp / ALIAS,
            {
                "round": rnd,
                "promoted": promoted,
                "arm": real,
                "kept": promoted == nom["incumbent"],
                "nomination_digest": nom["digest"],
                "source": str(src),
                "source_manifest_digest": record["digest"],
            },
        )
        manifest.write(tmp, extra={"kind": NOMINEE, "round": rnd, "arm": real}, written_as=out)
    return {"round": rnd, "promoted": promoted, "arm": real}


def _link_or_copy(src: Path, dst: Path) -> None:
    import os
    import shutil

    try:
        os.link(src, dst)  # the same bytes, no second copy of a full fine-tune's weights
    except OSError:
        shutil.copyfile(src, dst)


def trajectory(nominations: list[dict]) -> list[dict]:
    """Per round: the incumbent, what was promoted, and the promoted arm's (or, when the round
    kept its incumbent, the best candidate's) accuracy, delta, W/L and p."""
    rows = []
    for nom in nominations:
        cands = nom["candidates"]
        best = next((c for c in cands if c["arm"] == nom["promoted"]), None) or max(
            cands, key=lambda c: c["delta"]
        )
        rows.append(
            {
                "round": nom["round"],
                "incumbent": nom["incumbent"],
                "promoted": nom["promoted"],
                "kept": nom["promoted"] == nom["incumbent"],
                "arm": best["arm"],
                "incumbent_accuracy": best["ref_accuracy"],
                "accuracy": best["accuracy"],
                "delta": best["delta"],
                "wins": best["wins"],
                "losses": best["losses"],
                "p_value": best["p_value"],
                "digest": nom["digest"],
            }
        )
    return rows


def status(
    rounds: list[str], target: str, nominations: list[dict], stop: dict, budget_note: str | None
) -> dict:
    """rounds/{target}.json: the rounds that ran, and why the rest did not."""
    ran = [n["round"] for n in nominations]
    reason = None
    if target not in ran:
        kept = [n["promoted"] == n["incumbent"] for n in nominations]
        i = rounds.index(ran[-1]) + 1 if ran else 0
        reason = stop_reason(rounds, i, kept, stop, lambda r: budget_note) or budget_note
    return {
        "target": target,
        "rounds": ran,
        "stopped": reason,
        "trajectory": trajectory(nominations),
    }


def plot(path: Path, st: dict) -> None:
    from arenaflow.rounds import figures

    rows = st["trajectory"]
    if not rows:
        figures._empty(path, f"No continual round ran: {st['stopped']}")
        return
    plt = figures._plt()
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(rows), 4))
    xs = range(len(rows))
    ax.plot(
        xs,
        [r["incumbent_accuracy"] for r in rows],
        "s--",
        color=figures.GREY,
        label="incumbent",
    )
    ax.plot(
        xs,
        [r["accuracy"] for r in rows],
        "o-",
        color=figures.BLUE,
        label="promoted (or best candidate)",
    )
    for x, r in zip(xs, rows):
        ax.annotate(
            f"{r['arm']}{' (kept inc.)' if r['kept'] else ''}\nW/L {r['wins']}/{r['losses']}, "
            f"p={r['p_value']:.2g}",
            (x, r["accuracy"]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=7,
        )
    ax.set_xticks(list(xs), [r["round"] for r in rows])
    ax.set_ylabel("accuracy (%)")
    ax.set_title("continual rounds" + (f" ({st['stopped']})" if st["stopped"] else ""), fontsize=9)
    ax.legend(fontsize=8)
    figures._save(plt, fig, path)


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    from arenaflow import io

    ap = argparse.ArgumentParser(description="Continual rounds' jobs.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("nominee", help="runs/{round}-nominee/final from the sealed nomination")
    n.add_argument("--round", required=True)
    n.add_argument("--nomination", required=True)
    n.add_argument("--runs", required=True, help="the runs/ directory")
    n.add_argument("--out", required=True)
    s = sub.add_parser("status", help="rounds/{round}.json and its trajectory page")
    s.add_argument("--round", required=True, help="the target round")
    s.add_argument("--rounds-json", required=True, help="the template's rounds, in order")
    s.add_argument("--stop-json", required=True)
    s.add_argument("--budget-note", default="", help="why the next round was refused by the budget")
    s.add_argument("--nominations", nargs="*", default=[])
    s.add_argument("--out", required=True)
    s.add_argument("--plot", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "nominee":
        got = write_nominee(args.round, args.nomination, Path(args.runs), Path(args.out))
        print(f"round {got['round']}: nominee {got['promoted']} (arm {got['arm']}) -> {args.out}")
        return
    st = status(
        json.loads(args.rounds_json),
        args.round,
        [io.read_json(p) for p in args.nominations],
        json.loads(args.stop_json),
        args.budget_note or None,
    )
    io.write_json(args.out, st)
    plot(Path(args.plot), st)
    print(f"{args.round}: rounds run {st['rounds']}; {st['stopped'] or 'every round ran'}")


if __name__ == "__main__":
    main()
