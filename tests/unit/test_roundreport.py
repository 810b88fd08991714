"""arenaflow.rounds.report: one page of files per round, from the round's JSONs and run metrics."""

from __future__ import annotations

import json

import pytest

from arenaflow import io
from arenaflow.rounds import figures, registry, verdicts
from arenaflow.rounds import report as roundreport
from arenaflow.rounds.sweep import sweep_order, sweep_reading, sweep_sentence

pytest.importorskip("matplotlib")

RND = {
    "suite": "math",
    "regime": "greedy",
    "incumbent": "R2d",
    "candidates": ["B1", "B2", "B3", "B4"],
    "bar": [
        {"metric": "delta", "op": ">", "value": 0.0, "note": "accuracy points"},
        {"metric": "wins_minus_losses", "op": ">=", "value": 3},
    ],
}
ARMS = {
    "S1": {"init": "base", "policy": "reference", "lr": 1e-3},
    "R220": {"init": "S1", "policy": "S1", "lr": 1e-3},
    "R2d": {"init": "R220", "policy": "R220", "lr": 1e-3},
    "B1": {"init": "R2d", "policy": "R2d", "lr": 1e-5},
    "B2": {"init": "R2d", "policy": "R2d", "lr": 5e-6},
    "B3": {"init": "R2d", "policy": "R2d", "lr": 2e-5},
    "B4": {"init": "R2d", "policy": "R2d", "lr": 5e-5},
}
SWEEP = {
    "B2": (0.75, 9, 6),
    "B1": (1.00, 20, 14),
    "B3": (1.83, 22, 11),
    "B4": (-1.00, 10, 16),
}  # docs/lineages.md#000-the-lr-sweep


def test_round_report_writes_every_page_file(tmp_path):
    compares, paths = {}, []
    for regime, scale in (("greedy", 1.0), ("served", 0.1)):
        for arm, (d, w, l) in SWEEP.items():
            c = {
                "suite": "math",
                "regime": regime,
                "cand": arm,
                "ref": "R2d",
                "delta": d * scale,
                "wins": w,
                "losses": l,
                "p_value": 0.5,
                "ci95": [d * scale - 2, d * scale + 2],
                "wins_minus_losses": w - l,
                "accuracy": 90.0,
                "t": None,
            }
            p = tmp_path / f"compare/math/{regime}/{arm}__R2d.json"
            io.write_json(p, c)
            paths.append(str(p))
            if regime == "greedy":
                compares[arm] = c
    noise = tmp_path / "noise/math/served/R2d.json"
    io.write_json(
        noise,
        {
            "suite": "math",
            "regime": "served",
            "arm": "R2d",
            "k": 3,
            "replicate_accuracies": [84.31, 83.01, 80.39],
            "spread": 3.92,
            "mean_abs_delta": 2.61,
            "max_abs_t": 1.91,
        },
    )
    nom = verdicts.nominate("r3", RND, compares)
    io.write_json(tmp_path / "r3.json", {**nom, "registration": {"readouts_checked": 4}})
    io.write_json(tmp_path / "r3.bar.json", registry.register("r3", RND))
    runs = []
    for arm in ("R2d", "B1", "B3"):
        io.write_jsonl(
            tmp_path / f"runs/{arm}/final/metrics.jsonl",
            [{"step": s, "loss": 1.0 / s} for s in range(1, 6)],
        )
        runs.append(str(tmp_path / f"runs/{arm}/final"))
    out = tmp_path / "reports/r3"
    roundreport.main(
        [
            "--round",
            "r3",
            "--round-json",
            json.dumps(RND),
            "--arms-json",
            json.dumps(ARMS),
            "--nomination",
            str(tmp_path / "r3.json"),
            "--registration",
            str(tmp_path / "r3.bar.json"),
            "--compare",
            *paths,
            "--noise",
            str(noise),
            "--runs",
            *runs,
            "--out-dir",
            str(out),
        ]
    )
    for name in ("dose_response", "merges", "wins_losses", "noise_floor", "loss_curves", "lineage"):
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    page = (out / "nomination.html").read_text()
    assert nom["promoted"] == "B3" and "promoted B3" in page
    assert page.count("<tr><th>B") == 4 and "accuracy points" in page and nom["bar_sha256"] in page
    assert "The best, B3 (lr 2e-05), lies inside the sweep" in page  # the seed's own reading


def _compares(deltas: dict) -> dict:
    return {("greedy", a): {"delta": d} for a, d in deltas.items()}


def test_the_seeds_sweep_brackets_its_peak_at_2e_5_and_is_unimodal():
    r = sweep_reading(RND, ARMS, _compares({a: v[0] for a, v in SWEEP.items()}))
    assert (r["order"], r["best"], r["edge"], r["unimodal"]) == (
        ["B2", "B1", "B3", "B4"],
        "B3",
        None,
        True,
    )


def test_a_sweep_whose_best_is_its_lowest_lr_says_it_does_not_bracket_the_peak():
    # BENCHMARKS.md, run 17: SmolLM2's sweep at 1e-4, 2e-4, 4e-4, 1e-3 from R2d
    arms = {**ARMS, "B2": {"lr": 1e-4}, "B1": {"lr": 2e-4}, "B3": {"lr": 4e-4}, "B4": {"lr": 1e-3}}
    deltas = {"B2": 2.33, "B1": 0.33, "B3": -6.67, "B4": -26.33}
    r = sweep_reading(RND, arms, _compares(deltas))
    assert (r["best"], r["edge"], r["unimodal"]) == ("B2", "lowest", True)
    assert "at the sweep's lowest LR (1e-04)" in sweep_sentence(r)
    page = roundreport.sweep_html(RND, arms, _compares(deltas))
    assert "at the sweep&#x27;s lowest LR (1e-04)" in page and "an arm below it" in page
    flipped = sweep_reading(RND, arms, _compares({a: -d for a, d in deltas.items()}))
    assert (flipped["best"], flipped["edge"]) == ("B4", "highest")


def test_arms_tied_for_the_best_are_named_and_no_edge_is_claimed():
    # the embedded default's main job: B2, B3 and B4 all +1.67 against R2d
    deltas = {"B2": 1.67, "B1": 1.0, "B3": 1.67, "B4": 1.67}
    r = sweep_reading(RND, ARMS, _compares(deltas))
    assert (r["tied"], r["unimodal"]) == (["B2", "B3", "B4"], False)
    assert sweep_sentence(r) == (
        "B2, B3 and B4 tie for the best (+1.67 pt): the sweep does not single out one learning "
        "rate. The response is not unimodal."
    )


def test_a_response_that_rises_again_is_not_unimodal_and_two_lrs_are_no_sweep():
    r = sweep_reading(RND, ARMS, _compares({"B2": 1.0, "B1": -1.0, "B3": 2.0, "B4": 0}))
    assert (r["best"], r["edge"], r["unimodal"]) == ("B3", None, False)
    two = {**ARMS, "B4": {"lr": 1e-5}, "B3": {"lr": 1e-5}}
    assert sweep_reading(RND, two, _compares(dict.fromkeys(RND["candidates"], 1))) is None
    assert roundreport.sweep_html(RND, two, _compares(dict.fromkeys(RND["candidates"], 1))) == ""
    apart = {**ARMS, "B4": {**ARMS["B4"], "init": "R220"}}  # not one sweep
    assert sweep_reading(RND, apart, _compares(dict.fromkeys(RND["candidates"], 1))) is None


def test_sweep_is_ordered_by_learning_rate():
    assert sweep_order(RND["candidates"], ARMS) == ["B2", "B1", "B3", "B4"]


def test_pages_without_noise_or_metrics_say_so(tmp_path, monkeypatch):
    said = {}
    empty = figures._empty
    monkeypatch.setattr(
        figures, "_empty", lambda path, msg: (said.setdefault(path.name, msg), empty(path, msg))
    )
    figures.noise_floor(tmp_path / "n.png", {})
    figures.loss_curves(tmp_path / "l.png", {"B1": tmp_path / "missing"}, "R2d")
    assert "no noise floor was measured" in said["n.png"] and "K >= 2" in said["n.png"]
    assert "No training metrics" in said["l.png"]
    for name in ("n.png", "l.png"):  # still a page, one that says why it is empty
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


MERGED = {
    "soup": {"init": "B3", "weights": {"B3": 0.5, "B2": 0.5}},
    **{
        f"dose-a{x}": {
            "init": "R2d",
            "weights": {"R2d": 1 - a, "B3": a},
            "dose": {"from": "R2d", "to": "B3", "alpha": a},
        }
        for x, a in (("0p5", 0.5), ("1p5", 1.5), ("2", 2.0))
    },
}


def test_dose_line_runs_from_its_from_to_its_to_along_alpha():
    rnd = {**RND, "candidates": ["B3", "dose-a2", "dose-a0p5", "dose-a1p5"]}
    lines = figures.dose_lines(rnd, {**ARMS, **MERGED})
    # R2d is the incumbent (alpha 0) and B3 a candidate (alpha 1): both ends are on the line
    assert lines == {
        ("R2d", "B3"): {0.0: "R2d", 0.5: "dose-a0p5", 1.0: "B3", 1.5: "dose-a1p5", 2.0: "dose-a2"}
    }
    alone = figures.dose_lines({**RND, "candidates": ["dose-a2"]}, {**ARMS, **MERGED})
    assert alone == {("R2d", "B3"): {0.0: "R2d", 2.0: "dose-a2"}}  # B3 is not read by that round


def test_merges_come_after_the_sweep_and_get_their_own_page(tmp_path, monkeypatch):
    arms = {**ARMS, **MERGED}
    cands = ["soup", "B1", "dose-a0p5", "B2"]
    assert sweep_order(cands, arms) == ["B2", "B1", "soup", "dose-a0p5"]
    compares = {
        ("greedy", a): {"delta": d, "ci95": [d - 1, d + 1]}
        for a, d in (("B2", 0.5), ("B3", 1.0), ("soup", 0.8), ("dose-a0p5", 0.4))
    }
    drawn = []
    monkeypatch.setattr(
        figures,
        "_save",
        lambda plt, fig, path: drawn.append(
            [tuple(map(tuple, line.get_xydata())) for ax in fig.axes for line in ax.get_lines()]
        ),
    )
    figures.merges(
        tmp_path / "m.png", {**RND, "candidates": ["B2", "B3", "soup", "dose-a0p5"]}, arms, compares
    )
    # the dose line: R2d (0) -> dose-a0p5 (0.4) -> B3 (1.0), along alpha 0, 0.5, 1
    assert ((0.0, 0.0), (0.5, 0.4), (1.0, 1.0)) in drawn[0]
    # the soup beside its parents: B3, B2, soup at x 0, 1, 2
    assert ((0.0, 1.0), (1.0, 0.5), (2.0, 0.8)) in drawn[0]
    figs = []
    monkeypatch.setattr(figures, "_save", lambda plt, fig, path: figs.append(fig))
    figures.lineage(tmp_path / "l.png", {**RND, "candidates": ["B3", "soup"]}, arms, "soup")
    ax = figs[0].axes[0]
    boxes = {t.get_text(): t.get_position() for t in ax.texts if t.get_text()}
    dotted = {
        (a.xyann, a.xy)
        for a in ax.texts
        if not a.get_text() and a.arrow_patch.get_linestyle() == ":"
    }
    # B2 is drawn although the round reads only B3 and soup: it is merged into the soup
    assert {(boxes["B3"], boxes["soup"]), (boxes["B2"], boxes["soup"])} == dotted
    said = {}
    monkeypatch.setattr(figures, "_empty", lambda path, msg: said.setdefault(path.name, msg))
    figures.merges(tmp_path / "e.png", RND, ARMS, compares)
    assert "No merge or dose arm" in said["e.png"]


def test_the_page_tables_each_candidates_per_family_delta_and_fixed_lost():
    rnd = {"suite": "h6", "regime": "greedy", "incumbent": "R3", "candidates": ["SD", "X"]}
    fam = lambda d, w, l_, p: {"delta": d, "wins": w, "losses": l_, "p_value": p}  # noqa: E731
    compares = {
        ("greedy", "SD"): {
            "by_family": {"bullet": fam(10.0, 2, 1, 1.0), "quoted": fam(-20.0, 0, 2, 0.5)}
        },
        ("greedy", "X"): {"by_family": {"bullet": fam(0.0, 1, 1, 1.0)}},
    }
    page = roundreport.families_html(rnd, compares)
    assert (
        "<tr><th>bullet</th><td class=ok>+10.0 (2/1, p 1)</td>"
        "<td class=ok>+0.0 (1/1, p 1)</td></tr>" in page
    )
    assert "<tr><th>quoted</th><td class=no>-20.0 (0/2, p 0.5)</td><td>n/a</td></tr>" in page
    assert roundreport.families_html(rnd, {("greedy", "SD"): {"delta": 1.0}}) == ""  # math suites


def test_the_bundle_card_reads_the_sweep_from_the_sealed_nomination():
    """bundles.card.card_sweep: the nominating round's candidates in LR order with their sealed
    numbers and the reading; the merges and the incumbent are no part of it."""
    from arenaflow.bundles import card

    nom = {
        "regime": "greedy",
        "candidates": [
            {"arm": a, "delta": d, "wins": w, "losses": l, "p_value": 0.5}
            for a, (d, w, l) in {**SWEEP, "soup": (3.0, 9, 1)}.items()
        ],
    }
    arms = {**ARMS, "soup": {"init": "B1", "weights": {"B1": 0.5, "B3": 0.5}}}
    sweep = card.card_sweep(nom, arms)
    assert [(r["arm"], r["lr"], r["delta"]) for r in sweep["rows"]] == [
        ("B2", "5e-06", 0.75),
        ("B1", "1e-05", 1.0),
        ("B3", "2e-05", 1.83),
        ("B4", "5e-05", -1.0),
    ]
    assert (
        sweep["reading"]
        == "The best, B3 (lr 2e-05), lies inside the sweep. The response is unimodal."
    )
    assert (sweep["init"], sweep["policy"]) == ("R2d", "R2d")
    assert card.card_sweep(nom, {}) is None and card.card_sweep(None, arms) is None
