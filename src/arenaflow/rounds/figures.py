"""The round report's figures, each a PNG file (matplotlib, Agg backend).

Consumes the round's config section, the arms, the compare and noise JSONs and the runs'
metrics.jsonl; produces dose_response.png, merges.png, wins_losses.png, noise_floor.png,
loss_curves.png and lineage.png (a page that says why it is empty when there is nothing to draw).
"""

from __future__ import annotations

from pathlib import Path

from arenaflow import io
from arenaflow.rounds.sweep import lr_text, sweep_order

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
