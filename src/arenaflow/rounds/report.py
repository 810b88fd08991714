"""One report page per round: figures and the nomination table for `snakemake --report`.

    python -m arenaflow.rounds.report --round r3 --round-json '{...}' --arms-json '{...}' \
        --nomination nominations/r3.json --registration nominations/r3.bar.json \
        --compare compare/math/*/B?__R2d.json --noise noise/math/served/*.json \
        --runs runs/B1/final ... --out-dir reports/r3

Writes dose_response.png (delta with its 95% CI per trained candidate, in learning-rate order,
per regime, with the incumbent's noise floor as a band), merges.png (each dose line's delta along
alpha, each soup beside the arms it averages), wins_losses.png, noise_floor.png,
loss_curves.png, lineage.png and nomination.html. rules/report.smk wraps each in report() with
a caption from workflow/report/, under one category per round.
"""

from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

from arenaflow import io
from arenaflow.rounds import bar

GREEN, RED, BLUE, GOLD, GREY = "#2e7d32", "#c62828", "#1565c0", "#f9a825", "#9e9e9e"


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a cluster node
    import matplotlib.pyplot as plt

    return plt


def _empty(path: Path, text: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


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


def _label(a: str, arms: dict) -> str:
    lr = arms.get(a, {}).get("lr")
    return f"{a}\nlr {lr_text(lr)}" if lr else a


def dose_response(path: Path, rnd: dict, arms: dict, compares: dict, noises: dict) -> None:
    plt = _plt()
    order = [a for a in sweep_order(rnd["candidates"], arms) if "weights" not in arms.get(a, {})]
    regimes = sorted({r for (r, _c) in compares})
    fig, ax = plt.subplots(figsize=(1.6 * len(order) + 3, 4))
    width = 0.6 / max(1, len(regimes))
    for k, regime in enumerate(regimes):
        xs, ys, lo, hi = [], [], [], []
        for i, a in enumerate(order):
            c = compares.get((regime, a))
            if c is None:
                continue
            xs.append(i + (k - (len(regimes) - 1) / 2) * width)
            ys.append(c["delta"])
            lo.append(c["delta"] - c["ci95"][0])
            hi.append(c["ci95"][1] - c["delta"])
        bars = ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", capsize=4, label=f"{regime}")
        nz = noises.get((regime, rnd["incumbent"]))
        if nz:
            m = nz["mean_abs_delta"]
            ax.axhspan(
                -m,
                m,
                color=bars[0].get_color(),
                alpha=0.12,
                label=f"{regime}: noise floor of {rnd['incumbent']} (±{m:.2f} pt)",
            )
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(order)), [_label(a, arms) for a in order])
    ax.set_ylabel(f"Δ accuracy vs {rnd['incumbent']} (pt), 95% CI")
    ax.set_title(f"dose-response: {rnd['suite']}, paired by item")
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def dose_lines(rnd: dict, arms: dict) -> dict[tuple[str, str], dict[float, str]]:
    """{(from, to): {alpha: arm}} of the round's dose arms, with each end that the round reads
    (the incumbent or a candidate) at alpha 0 and 1."""
    read = {rnd["incumbent"], *rnd["candidates"]}
    lines: dict[tuple[str, str], dict[float, str]] = {}
    for a in rnd["candidates"]:
        d = arms.get(a, {}).get("dose")
        if d:
            line = lines.setdefault((d["from"], d["to"]), {})
            line[float(d["alpha"])] = a
            line.update({x: end for x, end in ((0.0, d["from"]), (1.0, d["to"])) if end in read})
    return {k: dict(sorted(v.items())) for k, v in lines.items()}


def _delta(compares: dict, regime: str, arm: str, incumbent: str):
    """(delta, lo, hi) of `arm` against the incumbent; the incumbent itself is 0 by definition."""
    if arm == incumbent:
        return 0.0, 0.0, 0.0
    c = compares.get((regime, arm))
    return None if c is None else (c["delta"], c["delta"] - c["ci95"][0], c["ci95"][1] - c["delta"])


def merges(path: Path, rnd: dict, arms: dict, compares: dict) -> None:
    """Each dose line's delta along alpha, and each soup beside the arms it averages."""
    lines = dose_lines(rnd, arms)
    soups = [a for a in rnd["candidates"] if "weights" in arms.get(a, {}) and "dose" not in arms[a]]
    if not lines and not soups:
        _empty(
            path,
            "No merge or dose arm among this round's candidates\n"
            "(config/arms/<arm>.yaml with merge: or dose:).",
        )
        return
    plt = _plt()
    regimes = sorted({r for (r, _c) in compares})
    panels = [("line", k) for k in lines] + ([("soups", None)] if soups else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (kind, key) in zip(axes[0], panels):
        for k, regime in enumerate(regimes):
            names = (
                list(lines[key].items())
                if kind == "line"
                else [(i, a) for i, a in enumerate(_soup_members(soups, arms))]
            )
            pts = [(x, a, _delta(compares, regime, a, rnd["incumbent"])) for x, a in names]
            pts = [(x + 0.06 * (k - (len(regimes) - 1) / 2), a, d) for x, a, d in pts if d]
            ax.errorbar(
                [p[0] for p in pts],
                [p[2][0] for p in pts],
                fmt="o-" if kind == "line" else "o",
                yerr=[[p[2][1] for p in pts], [p[2][2] for p in pts]],
                capsize=4,
                label=regime,
            )
            if kind == "line" and k == 0:
                for x, a, d in pts:
                    ax.annotate(a, (x, d[0]), textcoords="offset points", xytext=(4, 6), fontsize=7)
        if kind == "line":
            ax.set_xlabel(f"alpha: {key[0]} + alpha x ({key[1]} - {key[0]})")
            ax.set_title(f"dose line {key[0]} -> {key[1]}")
        else:
            members = _soup_members(soups, arms)
            ax.set_xticks(range(len(members)), members, fontsize=8)
            ax.set_title("soups beside the arms they average")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel(f"Δ accuracy vs {rnd['incumbent']} (pt), 95% CI")
        ax.legend(fontsize=8)
    _save(plt, fig, path)


def _soup_members(soups: list[str], arms: dict) -> list[str]:
    """Each soup after the arms it averages, each arm once."""
    return list(dict.fromkeys(a for s in soups for a in [*arms[s]["weights"], s]))


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def wins_losses(path: Path, rnd: dict, arms: dict, compares: dict) -> None:
    plt = _plt()
    order = sweep_order(rnd["candidates"], arms)
    regimes = sorted({r for (r, _c) in compares})
    fig, axes = plt.subplots(
        1, len(regimes), figsize=(4 + 1.2 * len(order) * len(regimes), 4), squeeze=False
    )
    for ax, regime in zip(axes[0], regimes):
        xs = range(len(order))
        cs = [compares.get((regime, a), {}) for a in order]
        w = [c.get("wins", 0) for c in cs]
        l = [c.get("losses", 0) for c in cs]
        ax.bar([x - 0.2 for x in xs], w, 0.4, color=GREEN, label="wins (fixed)")
        ax.bar([x + 0.2 for x in xs], l, 0.4, color=RED, label="losses (lost)")
        for x, c, top in zip(xs, cs, map(max, w, l)):
            if c:
                ax.text(x, top, f"p={c['p_value']:.2g}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), order)
        ax.set_ylim(0, 1.15 * max([*w, *l, 1]))  # headroom for the p labels
        ax.set_title(f"{rnd['suite']}/{regime} vs {rnd['incumbent']}")
        ax.legend(fontsize=8)
    _save(plt, fig, path)


def noise_floor(path: Path, noises: dict) -> None:
    if not noises:
        _empty(
            path,
            "No regime of this round's suite is read out with K >= 2 replicates,\n"
            "so no noise floor was measured (set replicates: K in config evals).",
        )
        return
    plt = _plt()
    regimes = sorted({r for r, _a in noises})
    fig, axes = plt.subplots(1, len(regimes), figsize=(3 + 1.5 * len(noises), 4), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        arms = sorted(a for r, a in noises if r == regime)
        for i, a in enumerate(arms):
            nz = noises[(regime, a)]
            acc = nz["replicate_accuracies"]
            ax.vlines(i, min(acc), max(acc), color=GREY, lw=6, alpha=0.5)
            ax.plot([i] * len(acc), acc, "o", color=BLUE)
            t = "n/a" if nz["max_abs_t"] is None else f"{nz['max_abs_t']:.2f}"
            ax.text(
                i + 0.1,
                sum(acc) / len(acc),
                f"spread {nz['spread']:.2f} pt\nmean|Δ| {nz['mean_abs_delta']:.2f} pt\nmax|t| {t}",
                ha="left",
                va="center",
                fontsize=7,
            )
        ax.set_xticks(range(len(arms)), arms)
        ax.set_xlim(-0.5, len(arms) - 0.1)
        ax.set_ylabel("replicate accuracy (%)")
        ax.set_title(f"self vs self, {regime} (K={noises[(regime, arms[0])]['k']})")
    _save(plt, fig, path)


def loss_curves(path: Path, runs: dict[str, Path], incumbent: str) -> None:
    curves = {
        a: io.read_jsonl(d / "metrics.jsonl")
        for a, d in runs.items()
        if (d / "metrics.jsonl").is_file()
    }
    if not curves:
        _empty(path, "No training metrics (runs/{arm}/final/metrics.jsonl) for this round's arms.")
        return
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for a, rows in sorted(curves.items()):
        rows = [r for r in rows if r.get("loss") is not None]
        ax.plot(
            [r["step"] for r in rows],
            [r["loss"] for r in rows],
            "--" if a == incumbent else "-",
            label=f"{a} (incumbent)" if a == incumbent else a,
        )
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title("loss curves (runs/{arm}/final/metrics.jsonl)")
    ax.legend(fontsize=8)
    _save(plt, fig, path)


def _sources(a: dict) -> list[tuple[str, str]]:
    """(arm, line style) of the edges into an arm: init solid, corpus policy dashed, a merge's
    arms dotted."""
    if "weights" in a or "nominee" in a:  # a merge's arms; the arms a nominee is one of
        return [(p, ":") for p in a.get("weights") or a["parents"]]
    return [(a["init"], "-"), (a.get("policy"), "--")]


def lineage(path: Path, rnd: dict, arms: dict, promoted: str) -> None:
    """base -> ... -> incumbent -> candidates: init edges solid, corpus-policy edges dashed,
    merge edges dotted."""
    plt = _plt()
    pos = _layout(_round_arms(rnd, arms), arms)
    levels = {x for x, _ in pos.values()}
    rows = max(sum(1 for x, _ in pos.values() if x == lv) for lv in levels)
    fig, ax = plt.subplots(figsize=(2 + 1.8 * len(levels), 1.5 + 0.8 * rows))
    for a in set(pos) - {"base"}:
        for src, style in _sources(arms[a]):
            # a corpus sampled by the init itself adds no information: draw it once, solid
            if src in pos and (style != "--" or src != arms[a]["init"]):
                ax.annotate(
                    "",
                    pos[a],
                    pos[src],
                    arrowprops={
                        "arrowstyle": "-|>",
                        "ls": style,
                        "shrinkA": 16,
                        "shrinkB": 16,  # stop at boxes
                        "color": GREY if style == "--" else "black",
                    },
                )
    for a, (x, y) in pos.items():
        color = _box_color(a, rnd, promoted)
        ax.text(
            x,
            y,
            a,
            ha="center",
            va="center",
            fontsize=9,
            color="white" if color == BLUE else "black",
            bbox={"boxstyle": "round", "fc": color, "ec": "black"},
        )
    ax.set_xlim(-0.6, max(levels) + 0.6)
    ax.set_ylim(min(p[1] for p in pos.values()) - 0.8, max(p[1] for p in pos.values()) + 0.8)
    ax.axis("off")
    ax.set_title(
        f"round lineage: init (solid), corpus sampled by (dashed), merged from (dotted); "
        f"gold = promoted {promoted}",
        fontsize=9,
    )
    _save(plt, fig, path)


def _round_arms(rnd: dict, arms: dict) -> set[str]:
    """The round's arms and everything they come from, and 'base'."""
    keep, stack = {"base"}, [rnd["incumbent"], *rnd["candidates"], rnd.get("control")]
    while stack:
        a = stack.pop()
        if a in arms and a not in keep:  # 'base', 'reference' and None end a walk
            keep.add(a)
            stack += [src for src, _ in _sources(arms[a])]
    return keep


def _layout(keep: set[str], arms: dict) -> dict[str, tuple[float, float]]:
    """(x, y) of each arm: x its depth from base through init or merge edges, y its place among
    the arms of that depth, centred."""
    depth = {"base": 0}

    def d(a):
        if a not in depth:
            srcs = [s for s, style in _sources(arms[a]) if style != "--"]
            depth[a] = max(d(s) for s in srcs) + 1
        return depth[a]

    levels: dict[int, list[str]] = {}
    for a in sorted(keep):
        levels.setdefault(d(a), []).append(a)
    return {
        a: (lv, i - (len(names) - 1) / 2)
        for lv, names in levels.items()
        for i, a in enumerate(names)
    }


def _box_color(a: str, rnd: dict, promoted: str) -> str:
    if a == promoted:
        return GOLD
    if a == rnd["incumbent"]:
        return BLUE
    return "#c8e6c9" if a in rnd["candidates"] else "#eeeeee"


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}" if isinstance(x, float) else str(x)


def families_html(rnd: dict, compares: dict) -> str:
    """Per constraint family, each candidate's delta (points) and fixed/lost against the
    incumbent on the round's suite and regime (the compare JSON's by_family,
    arenaflow.instruct.families):
    lineage 002's per-family H6 table, read for a collapsed family. Empty for a suite without
    constraints."""
    e = html.escape
    tables = {
        c: compares[(rnd["regime"], c)]["by_family"]
        for c in rnd["candidates"]
        if "by_family" in compares.get((rnd["regime"], c), {})
    }
    if not tables:
        return ""
    families = sorted({f for t in tables.values() for f in t})
    head = "".join(f"<th>{e(c)}</th>" for c in tables)
    rows = []
    for f in families:
        cells = "".join(
            "<td>n/a</td>"
            if f not in t
            else f"<td class={'no' if t[f]['delta'] < 0 else 'ok'}>{t[f]['delta']:+.1f} "
            f"({t[f]['wins']}/{t[f]['losses']}, p {_fmt(t[f]['p_value'])})</td>"
            for t in tables.values()
        )
        rows.append(f"<tr><th>{e(f)}</th>{cells}</tr>")
    return (
        f"<h3>Per constraint family on {e(rnd['suite'])}/{e(rnd['regime'])}: delta (pt), "
        "fixed/lost, sign-test p</h3>\n"
        f"<table class=families><tr><th>family</th>{head}</tr>\n{''.join(rows)}</table>\n"
    )


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


def sweep_html(rnd: dict, arms: dict, compares: dict) -> str:
    """sweep_reading as a paragraph of the round's page ('' without a sweep)."""
    r = sweep_reading(rnd, arms, compares)
    if r is None:
        return ""
    e = html.escape
    points = ", ".join(
        f"{e(a)} lr {lr_text(lr)}: {d:+.2f}"
        for a, lr, d in zip(*map(r.get, ("order", "lr", "delta")))
    )
    return (
        f"<h3>LR sweep on {e(rnd['suite'])}/{e(rnd['regime'])}: delta (pt) vs "
        f"{e(rnd['incumbent'])}</h3>\n<p>{points}. {e(sweep_sentence(r))}</p>\n"
    )


def nomination_html(nom: dict, registration: dict, extra: str = "") -> str:
    e = html.escape

    def threshold(c: dict) -> str:
        if "value" in c:
            return e(_fmt(c["value"]))
        return e(str(c["noise"]["times"])) + " x " + e(c["noise"]["stat"])

    head = "".join(
        f"<th>{e(str(c['clause']))}. {e(c['metric'])}"
        f"{' vs ' + e(c['against']) if c.get('against') else ''} {e(c['op'])} "
        f"{threshold(c)}"
        f"<br><small>{e(c['suite'])}/{e(c['regime'])}</small></th>"
        for c in nom["bar_resolved"]
    )
    rows = []
    for v in nom["candidates"]:
        cells = "".join(
            f"<td class={'ok' if c['holds'] else 'no'}>{e(_fmt(c['observed']))} {e(c['op'])} "
            f"{e(_fmt(c['threshold']))}<br>{'holds' if c['holds'] else 'fails'}</td>"
            for c in v["clauses"]
        )
        mark = " (promoted)" if v["arm"] == nom["promoted"] else ""
        rows.append(
            f"<tr><th>{e(v['arm'])}{mark}</th><td>{_fmt(v['delta'])}</td>"
            f"<td>{v['wins']}/{v['losses']}</td><td>{_fmt(v['p_value'])}</td>"
            f"<td>{_fmt(v.get('t'))}</td>{cells}<td>{'yes' if v['clears'] else 'no'}</td></tr>"
        )
    notes = "".join(
        f"<li>{c['clause']}: {e(c['note'])}</li>" for c in nom["bar_resolved"] if c.get("note")
    )
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>round {e(nom['round'])}</title>\n"
        "<style>body{font-family:sans-serif} "
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:center}\n"
        "table{border-collapse:collapse} .ok{background:#e8f5e9} .no{background:#ffebee}"
        "</style></head><body>\n"
        f"<h2>Round {e(nom['round'])}: promoted {e(nom['promoted'])}</h2>\n"
        f"<p>{e(nom['reason'])}</p>\n"
        f"<p>Primary comparison: {e(nom['suite'])}/{e(nom['regime'])} "
        f"against the incumbent {e(nom['incumbent'])}.\n"
        f"Bar sha256 <code>{e(nom['bar_sha256'])}</code>, "
        f"registered {e(registration.get('registered_utc', '?'))}\n"
        f"before the {e(str(nom.get('registration', {}).get('readouts_checked', '?')))} "
        "candidate readouts it judges.</p>\n"
        "<table><tr><th>arm</th><th>Δ (pt)</th><th>W/L</th><th>McNemar p</th>"
        f"<th>t (replicates)</th>{head}<th>clears</th></tr>\n"
        f"{''.join(rows)}</table>{f'<ul>{notes}</ul>' if notes else ''}{extra}</body></html>\n"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round", required=True)
    ap.add_argument("--round-json", required=True)
    ap.add_argument(
        "--arms-json",
        required=True,
        help="{arm: {init, policy, lr}} ({arm: {init, weights[, dose]}} for a merge)",
    )
    ap.add_argument("--nomination", required=True)
    ap.add_argument("--registration", required=True)
    ap.add_argument(
        "--compare", nargs="*", default=[], help="candidates vs the incumbent, any regime"
    )
    ap.add_argument("--noise", nargs="*", default=[])
    ap.add_argument("--runs", nargs="*", default=[], help="runs/{arm}/final of the round's arms")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args(argv)
    rnd, arms = json.loads(args.round_json), json.loads(args.arms_json)
    nom, reg = io.read_json(args.nomination), io.read_json(args.registration)
    compares = {}
    for p in args.compare:
        c = io.read_json(p)
        if c["ref"] == rnd["incumbent"] and c.get("suite", rnd["suite"]) == rnd["suite"]:
            compares[(c.get("regime") or rnd["regime"], c["cand"])] = c
    noises = {(n["regime"], n["arm"]): n for n in map(io.read_json, args.noise)}
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dose_response(out / "dose_response.png", rnd, arms, compares, noises)
    merges(out / "merges.png", rnd, arms, compares)
    wins_losses(out / "wins_losses.png", rnd, arms, compares)
    noise_floor(out / "noise_floor.png", noises)
    loss_curves(
        out / "loss_curves.png", {Path(r).parent.name: Path(r) for r in args.runs}, rnd["incumbent"]
    )
    lineage(out / "lineage.png", rnd, arms, nom["promoted"])
    extra = sweep_html(rnd, arms, compares) + families_html(rnd, compares)
    io.write_text(out / "nomination.html", nomination_html(nom, reg, extra))
    print(f"round {args.round}: report files in {out} ({bar.bar_sha256(nom['bar_resolved'])[:12]})")


if __name__ == "__main__":
    main()
