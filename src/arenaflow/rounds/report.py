"""One report page per round: figures and the nomination table for `snakemake --report`.

    python -m arenaflow.rounds.report --round r3 --round-json '{...}' --arms-json '{...}' \
        --nomination nominations/r3.json --registration nominations/r3.bar.json \
        --compare compare/math/*/B?__R2d.json --noise noise/math/served/*.json \
        --runs runs/B1/final ... --out-dir reports/r3

Writes dose_response.png (delta with its 95% CI per trained candidate, in learning-rate order,
per regime, with the incumbent's noise floor as a band), merges.png (each dose line's delta along
alpha, each soup beside the arms it averages), wins_losses.png, noise_floor.png,
loss_curves.png, lineage.png and nomination.html. rules/report.smk wraps each in report() with
a caption from workflow/report/, under one category per round. The figures are drawn by
arenaflow.rounds.figures, the LR sweep read by arenaflow.rounds.sweep; this module writes the
page's HTML.
"""

from __future__ import annotations

import argparse
import html
import json
from pathlib import Path

from arenaflow import io
from arenaflow.rounds import bar, gate
from arenaflow.rounds.figures import (
    dose_response,
    lineage,
    loss_curves,
    merges,
    noise_floor,
    wins_losses,
)
from arenaflow.rounds.sweep import lr_text, sweep_reading, sweep_sentence


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


def snr_rows(rnd: dict, nom: dict, compares: dict, noises: dict) -> dict:
    """{"suite/regime": gate.snr_of(...)} of each regime the report compares on the round's suite,
    and, with their admission, of every suite the nomination gated on (gate.snr)."""
    out = {}
    for regime in sorted({g for g, _ in compares}):
        accs = {}
        for (g, cand), c in compares.items():
            if g == regime:
                accs[cand], accs[rnd["incumbent"]] = c.get("accuracy"), c.get("ref_accuracy")
        out[f"{rnd['suite']}/{regime}"] = gate.snr_of(accs, noises.get((regime, rnd["incumbent"])))
    return {**out, **nom.get("snr", {})}


def snr_html(rows: dict) -> str:
    """The signal-to-noise table: each suite's spread of arms' accuracies over its noise floor."""
    e = html.escape
    body = "".join(
        f"<tr><th>{e(k)}</th><td>{_fmt(v['signal'])}</td><td>{_fmt(v['noise'])}</td>"
        f"<td>{_fmt(v['snr']) if v['snr'] is not None else 'n/a: ' + e(str(v['why']))}</td>"
        f"<td>{e(v.get('admission', 'not gated on'))}</td></tr>"
        for k, v in rows.items()
    )
    return (
        "<h3>Signal to noise</h3>\n<p>Range of the arms' accuracies (points) over the range of "
        "the incumbent's replicate accuracies (its noise floor); a suite below promotion.min_snr "
        "cannot gate unless the config admits it (docs/statistics.md).</p>\n<table><tr>"
        "<th>suite/regime</th><th>signal (pt)</th><th>noise (pt)</th><th>SNR</th>"
        f"<th>as a gating suite</th></tr>{body}</table>\n"
        if rows
        else ""
    )


def power_html(nom: dict) -> str:
    """Each clause's MDE as registered and as measured per candidate (gate.measured_power), with
    its `underpowered_measured` flag ('' for a nomination without it)."""
    pm = nom.get("power_measured")
    if not pm:
        return ""
    e = html.escape
    body = "".join(
        f"<tr><th>{r['clause']}. {e(r['metric'])} on {e(r['suite'])}/{e(r['regime'])}</th>"
        f"<td>{e(r['candidate'])}</td><td>{_fmt(r.get('asks'))}</td>"
        f"<td>{_fmt(r['mde_planned'])}</td><td>{_fmt(r['mde'])}</td>"
        f"<td>{_fmt(r['n'])} {e(r['unit'])}</td><td>{_fmt(r['sd'])}</td>"
        f"<td>{_fmt(r['ref_accuracy'])}</td><td>{_fmt(r['discordance'])}</td>"
        f"<td class={'no' if r['underpowered_measured'] else 'ok'}>{e(r['status'])}</td></tr>"
        for r in pm["clauses"]
    )
    return (
        "<h3>Power: what the bar could detect</h3>\n<p>Minimum detectable effect (points) at "
        f"power {pm['power']:g} and two-sided alpha {pm['alpha']:g}: registered from the "
        "config's planning values, and measured from the SD of each comparison's differences "
        "over its units. A clause asking for less than the measured MDE is underpowered as "
        "measured: evidence beside the decision, which the registered bar fixed "
        "(docs/statistics.md).</p>\n<table><tr><th>clause</th><th>candidate</th>"
        "<th>asks (pt)</th><th>MDE registered (pt)</th><th>MDE measured (pt)</th><th>units</th>"
        "<th>SD of differences (pt)</th><th>reference accuracy (pt)</th><th>discordance</th>"
        f"<th>standing</th></tr>{body}</table>\n"
    )


def _raw(c: dict) -> str:
    """A multiplicity-adjusted p's raw value and method, under its cell."""
    if "p_raw" not in c:
        return ""
    return f"<br><small>{html.escape(c['adjust'])}; raw p {_fmt(c['p_raw'])}</small>"


def _underpowered(c: dict) -> str:
    """A clause that asked for less than its measured MDE, under its cell."""
    if not c.get("underpowered_measured"):
        return ""
    return f"<br><small>underpowered as measured (MDE {_fmt(c['mde_measured'])} pt)</small>"


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
            f"{e(_fmt(c['threshold']))}<br>{'holds' if c['holds'] else 'fails'}"
            f"{_raw(c)}{_underpowered(c)}</td>"
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
    from arenaflow.evals.compare import finite_record  # pandas: only when a report is drawn

    compares = {}
    for p in args.compare:
        c = finite_record(io.read_json(p), p)
        if c["ref"] == rnd["incumbent"] and c.get("suite", rnd["suite"]) == rnd["suite"]:
            compares[(c.get("regime") or rnd["regime"], c["cand"])] = c
    noises = {}
    for p in args.noise:
        n = finite_record(io.read_json(p), p)
        noises[(n["regime"], n["arm"])] = n
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
    extra += snr_html(snr_rows(rnd, nom, compares, noises)) + power_html(nom)
    io.write_text(out / "nomination.html", nomination_html(nom, reg, extra))
    print(f"round {args.round}: report files in {out} ({bar.bar_sha256(nom['bar_resolved'])[:12]})")


if __name__ == "__main__":
    main()
