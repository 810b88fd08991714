"""Lineage 002's v749 decision through the real register -> compare -> judge path: the card's
pre-registered rule (positive headline delta, no collapsed family, probe not below the
incumbent) clears v749 on noise-sized deltas; the same rule with a noise-aware clause keeps the
incumbent, as the card did by judgement (docs/lineages.md#002-the-2x2-null-grid)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from scipy import stats as sps

from arenaflow import io
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout_file, readout_rows
from arenaflow.rounds import bar, nominate

FAMILIES = (
    "para", "word_times", "no_char", "highlights", "word_max", "sent",
    "bullet", "word_min", "is_lower", "is_upper", "placeholders", "postscript",
)  # fmt: skip
CARD_RULE = [
    {"metric": "delta", "op": ">", "value": 0.0, "note": "a positive headline delta"},
    {"metric": "family_delta_min", "op": ">=", "value": -5.0, "note": "no family collapsed"},
    {"suite": "if_probe", "metric": "delta", "op": ">=", "value": 0.0, "note": "probe2"},
]
NOISE_AWARE = [*CARD_RULE, {"metric": "p_value", "op": "<", "value": 0.05, "note": "not noise"}]


def outcomes(n: int, ref_pass: int, wins: int, losses: int) -> tuple[list, list]:
    """Per-item (cand, ref) pass over n items: `wins` fixed, `losses` lost, the rest tied."""
    ref = [True] * ref_pass + [False] * (n - ref_pass)
    cand = list(ref)
    for i in range(losses):  # lost: ref passes, cand fails
        cand[i] = False
    for i in range(wins):  # fixed: ref fails, cand passes
        cand[ref_pass + i] = True
    return cand, ref


def suite_rows(suite: str, per_family: dict) -> tuple[list, list, list]:
    """(items, cand, ref) over families: {family: (n, ref_pass, wins, losses)}."""
    items, cand, ref = [], [], []
    for family, spec in per_family.items():
        c, r = outcomes(*spec)
        items += [(f"{suite}-{family}-{i}", family) for i in range(spec[0])]
        cand += c
        ref += r
    return items, cand, ref


def write(path, arm, items, passed, replicate=0):
    df = pd.DataFrame(
        {
            "arm": arm,
            "item_id": [i for i, _ in items],
            "replicate": replicate,
            "category": [f for _, f in items],
            "prompt_sha256": [f"p-{i}" for i, _ in items],
            "target_sha256": [f"t-{f}" for _, f in items],
            "completion": ["An answer."] * len(items),
            "n_tokens": 3,
            "stopped": True,
            "correct": passed,
            "checks": [json.dumps([{"type": f, "passed": p}]) for (_, f), p in zip(items, passed)],
        }
    )
    readout_file.write_readout(
        readout_rows.structure(df), path, {"arm": arm, "replicate": replicate}
    )
    return str(path)


# H6-800: 37 fixed / 36 lost spread over twelve families (delta +1/800 = +0.0013, p = 1.000);
# probe2-1200: 0.7133 -> 0.7292, 102 fixed / 83 lost (p = 0.186), placeholders 19/32
H6 = {f: (66 if i < 8 else 68, 55, 4 if i == 0 else 3, 3) for i, f in enumerate(FAMILIES)}
PROBE = {
    **{f: (100, 70, 8, 5) for f in FAMILIES[:10]},
    "placeholders": (100, 76, 19, 32),
    "postscript": (100, 80, 3, 1),
}


def round_(bar_):
    return {
        "suite": "h6",
        "regime": "greedy",
        "incumbent": "v6141",
        "candidates": ["v749"],
        "bar": bar_,
    }


def run_round(tmp_path, bar_, h6=None, extra=None) -> dict:
    """Register the round, then read out (readouts must postdate the bar), compare and judge;
    `extra(tmp_path)` makes further (compares, noises, readouts) after the registration."""
    rnd, reg = round_(bar_), str(tmp_path / "nominations/r8.bar.json")
    nominate.main(["register", "--round", "r8", "--round-json", json.dumps(rnd), "--out", reg])
    compares, readouts = [], []
    for suite, spec in (("h6", h6 or H6), ("if_probe", PROBE)):
        items, cand, ref = suite_rows(suite, spec)
        c = write(tmp_path / f"{suite}.v749.parquet", "v749", items, cand)
        r = write(tmp_path / f"{suite}.v6141.parquet", "v6141", items, ref)
        out = str(tmp_path / f"compare/{suite}/greedy/v749__v6141.json")
        comparisons.main(
            ["compare", "--suite", suite, "--regime", "greedy", "--cand", c, "--ref", r]
            + ["--out", out]
        )
        compares.append(out)
        readouts.append(c)
    out = tmp_path / "nominations/r8.json"
    more_compares, noises, more_readouts = extra(tmp_path) if extra else ([], [], [])
    nominate.main(
        ["judge", "--round", "r8", "--round-json", json.dumps(rnd), "--registration", reg]
        + ["--compare", *compares, *more_compares, "--noise", *noises]
        + ["--readouts", *readouts, *more_readouts, "--out", str(out)]
    )
    return io.read_json(out)


def test_the_fixture_is_the_cards_v749_read(tmp_path):
    items, cand, ref = suite_rows("h6", H6)
    assert len(items) == 800
    wins = sum(c and not r for c, r in zip(cand, ref))
    losses = sum(r and not c for c, r in zip(cand, ref))
    assert (wins, losses) == (37, 36)
    assert (sum(cand) - sum(ref)) / 800 == pytest.approx(0.0013, abs=5e-5)
    items, cand, ref = suite_rows("p", PROBE)
    assert len(items) == 1200 and sum(ref) / 1200 == pytest.approx(0.7133, abs=5e-5)
    assert sum(cand) / 1200 == pytest.approx(0.7292, abs=5e-5)
    wins = sum(c and not r for c, r in zip(cand, ref))
    assert (wins, sum(r and not c for c, r in zip(cand, ref))) == (102, 83)
    assert sps.binomtest(102, 185).pvalue == pytest.approx(0.186, abs=5e-4)


def test_the_cards_rule_promotes_v749_on_noise_sized_deltas(tmp_path):
    out = run_round(tmp_path, CARD_RULE)
    (v,) = out["candidates"]
    assert out["promoted"] == "v749" and v["clears"]
    observed = {c["clause"]: c["observed"] for c in v["clauses"]}
    assert observed[1] == pytest.approx(100 / 800)  # +0.125 pt
    assert observed[2] >= -5.0 and observed[2] == min(
        io.read_json(tmp_path / "compare/h6/greedy/v749__v6141.json")["by_family"][f]["delta"]
        for f in FAMILIES
    )
    assert observed[3] == pytest.approx(100 * 19 / 1200)
    assert v["p_value"] == pytest.approx(1.0)


def test_a_noise_aware_clause_keeps_the_incumbent(tmp_path):
    out = run_round(tmp_path, NOISE_AWARE)
    (v,) = out["candidates"]
    assert out["promoted"] == "v6141" and not v["clears"] and v["failed"] == [4]
    assert "p_value" in out["reason"] and "v6141 stays" in out["reason"]
    assert [c["holds"] for c in v["clauses"]] == [True, True, True, False]


NOISE_FLOOR = [
    *CARD_RULE,
    {
        "regime": "sampled",
        "metric": "delta",
        "op": ">=",
        "noise": {"stat": "max_abs_delta", "times": 1},
        "note": "larger than the incumbent against itself",
    },
]


def sampled_reads(tmp_path) -> tuple[list, list, list]:
    """h6 under a sampled regime, K = 2 replicates per arm: the incumbent's two reads differ by
    12 of 800 prompts (1.5 points, the size of the card's seed-to-seed spread); v749's are its
    greedy read with the same 12 prompts flipped, so its pooled delta stays +0.125 point.
    (compares, noises, candidate readouts)"""
    items, cand, ref = suite_rows("h6", H6)
    flip = [i for i, r in enumerate(ref) if not r and not cand[i]][:12]
    reads = {}
    for arm, base in (("v749", cand), ("v6141", ref)):
        second = [not v if i in flip else v for i, v in enumerate(base)]
        reads[arm] = [
            write(tmp_path / f"h6s.{arm}.r{k}.parquet", arm, items, passed, replicate=k)
            for k, passed in enumerate((base, second))
        ]
    out = str(tmp_path / "compare/h6/sampled/v749__v6141.json")
    comparisons.main(
        ["compare", "--suite", "h6", "--regime", "sampled", "--cand", *reads["v749"]]
        + ["--ref", *reads["v6141"], "--out", out]
    )
    noise = str(tmp_path / "noise/h6/sampled/v6141.json")
    comparisons.main(
        ["noise", "--suite", "h6", "--regime", "sampled", "--readouts", *reads["v6141"]]
        + ["--out", noise]
    )
    return [out], [noise], reads["v749"]


def test_a_noise_floor_clause_keeps_the_incumbent_too(tmp_path):
    out = run_round(tmp_path, NOISE_FLOOR, extra=sampled_reads)
    (v,) = out["candidates"]
    floor = v["clauses"][3]
    assert floor["threshold"] == pytest.approx(100 * 12 / 800)  # max |delta| of v6141 vs itself
    assert floor["observed"] == pytest.approx(100 * 2 / 1600) and not floor["holds"]
    assert out["promoted"] == "v6141" and v["failed"] == [4]


def test_a_collapsed_family_fails_the_floor_clause(tmp_path):
    # a positive headline (41 fixed / 38 lost), but is_lower loses 8 of 68 prompts, fixes none
    h6 = {**H6, "para": (66, 55, 11, 0), "is_lower": (68, 55, 0, 8)}
    out = run_round(tmp_path, CARD_RULE, h6)
    (v,) = out["candidates"]
    floor = next(c for c in v["clauses"] if c["metric"] == "family_delta_min")
    assert floor["observed"] == pytest.approx(-100 * 8 / 68) and not floor["holds"]
    assert out["promoted"] == "v6141" and v["failed"] == [2]
    assert (v["wins"], v["losses"]) == (41, 38)


def test_family_delta_min_on_a_suite_without_constraints_is_undefined_and_fails():
    clause = bar.resolve({**round_([CARD_RULE[1]]), "suite": "math"})[0]
    comp = {"delta": 1.0, "p_value": 0.5}
    v = bar.judge_clause(clause, "v749", "v6141", {("math", "greedy", "v749", "v6141"): comp}, {})
    assert v["observed"] is None and not v["holds"] and "family_delta_min" in v["undefined"]


def test_the_schema_names_exactly_the_metrics_the_bar_knows(repo_root):
    schema = yaml.safe_load((repo_root / "workflow/schemas/config.schema.yaml").read_text())
    clause = schema["properties"]["rounds"]["additionalProperties"]["properties"]["bar"]["items"]
    assert clause["properties"]["metric"]["enum"] == [*bar.PAIRED, *bar.LEVELS]
