"""Lineage 002 (config/seeds/002.yaml, standalone) through Snakemake on CPU, at the `dag` tier's
size (tests/e2e/seed002.yaml): SFT on two disjoint bands of the chat corpus -> the DPO grid and
its round -> IF repair from the anchor -> round-6 self-distillation judged by the card's rule ->
the 2x2 null grid judged against r6's nominee. Checks the report's tables against independent
recounts: the per-family deltas from the readouts' per-constraint verdicts, each null cell's
sign-test p from scipy, and every clause of the card's bar.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from dagrun import REPO, build, planned_jobs
from scipy.stats import binomtest

pytestmark = pytest.mark.dag

CONFIG = (REPO / "config/seeds/002.yaml", REPO / "tests/e2e/seed002.yaml")
TARGETS = (
    "judged/chat_r6/pairs.jsonl",  # the card's blinded read, built on request
    "reports/r7/nomination.html",
    "reports/r6/nomination.html",
    "reports/dpo/nomination.html",
)
GRID = {"N-nom-x1": ("r6-nominee", "mix_x1"), "N-nom-x2": ("r6-nominee", "mix_x2"),
        "N-par-x1": ("R3", "mix_x1"), "N-par-x2": ("R3", "mix_x2")}  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(
        tmp_path_factory.mktemp("seed002"), CONFIG, TARGETS, REPO / "config/seeds/002/arms"
    )


def read(built, path):
    return json.loads((built["results"] / path).read_text())


def rows(built, path):
    return [json.loads(x) for x in (built["results"] / path).read_text().splitlines()]


def test_the_standalone_lineage_plans_no_math_and_every_stage(built):
    jobs = planned_jobs(built["dry"])
    trained = {wc.split("=")[1] for r, wc in jobs if r == "train_arm"}
    assert trained == {"S1", "S2", "R3", "SD", *GRID} | {
        f"D-b{b}-lr{lr}" for b in ("0p1", "0p5") for lr in ("5e-4", "2e-3")
    }
    pools = {wc.split("=")[1] for r, wc in jobs if r == "build_pool"}
    assert not {"math_eval", "sft_s1", "math_r1"} & pools  # config/config.yaml is not read
    assert {("nominate", f"rnd={r}") for r in ("dpo", "r6", "r7")} <= set(jobs)


def test_each_sft_epoch_reads_a_fresh_band_of_the_chat_corpus(built):
    e0, e1 = (rows(built, f"pools/chat_e{i}.jsonl") for i in (0, 1))
    src = (REPO / "data/synthchat.jsonl").read_text().splitlines()
    assert len(e0) + len(e1) == len(src)
    texts = [
        {(json.dumps(r.get("context")), r["prompt"], r["reference"]) for r in b} for b in (e0, e1)
    ]
    assert not texts[0] & texts[1]
    s1, s2 = (read(built, f"runs/{a}/final/training_evidence.json") for a in ("S1", "S2"))
    assert (s1["corpus"], s1["init"], s2["corpus"], s2["init"]) == (
        "sft_e0",
        "base",
        "sft_e1",
        "S1",
    )


def test_the_dpo_arms_train_on_on_policy_pairs_with_the_nll_term(built):
    pairs = rows(built, "corpora/pref/rows.jsonl")
    verdicts = {v["id"]: v for v in rows(built, "candidates/pref/verdicts.jsonl")}
    assert pairs and all(
        verdicts[p["source"]]["correct"] and not verdicts[p["rejected_source"]]["correct"]
        for p in pairs
    )
    grid = {}
    for f in (built["arms"]).glob("D-*.yaml"):
        ev = read(built, f"runs/{f.stem}/final/training_evidence.json")
        h = ev["hyperparameters"]
        assert (h["objective"], h["nll_weight"], ev["init"]) == ("dpo", 1.0, "S2")
        grid[(h["beta"], h["lr"])] = f.stem
    assert set(grid) == {(b, lr) for b in (0.1, 0.5) for lr in (5e-4, 2e-3)}
    dpo = read(built, "nominations/dpo.json")
    assert [c["metric"] for c in dpo["bar_resolved"]] == ["delta", "tool_leak_rate"]
    # the repair corpus is sampled by the anchor the round chose, and R3 starts from it
    assert read(built, "runs/dpo-nominee/final/nominee.json")["arm"] == dpo["promoted"]
    assert read(built, "runs/R3/final/training_evidence.json")["init"] == "dpo-nominee"


def test_repair_keeps_one_checker_verified_sample_per_prompt(built):
    kept = rows(built, "corpora/repair/rows.jsonl")
    verdicts = {v["id"]: v for v in rows(built, "candidates/repair/verdicts.jsonl")}
    pool = {r["id"]: r for r in rows(built, "pools/if_repair.jsonl")}
    from arenaflow.instruct import check as ifcheck

    assert kept and len({r["id"] for r in kept}) == len(kept)
    for r in kept:
        assert verdicts[r["source"]]["correct"]
        assert ifcheck.check(r["completion"], pool[r["id"]]["constraints"])["passed"]


def test_the_per_family_table_matches_a_recount_of_the_readouts(built):
    comp = read(built, "compare/h6/greedy/SD__R3.json")
    res = built["results"]
    cand, ref = (
        pd.read_parquet(res / f"readouts/h6/{a}/greedy.r0.parquet").set_index("item_id")
        for a in ("SD", "R3")
    )
    recount = {}
    for item, cell in cand["checks"].items():
        for c, r in zip(json.loads(cell), json.loads(ref.loc[item, "checks"])):
            w, l_, n = recount.get(c["type"], (0, 0, 0))
            recount[c["type"]] = (w + (c["passed"] and not r["passed"]),
                                  l_ + (r["passed"] and not c["passed"]), n + 1)  # fmt: skip
    table = comp["by_family"]
    assert set(table) == set(recount) and len(table) == 12  # the card's twelve families
    for fam, (w, l_, n) in recount.items():
        row = table[fam]
        assert (row["wins"], row["losses"], row["prompts"]) == (w, l_, n), fam
        assert row["delta"] == pytest.approx(100.0 * (w - l_) / n)
    assert comp["family_delta_min"] == min(r["delta"] for r in table.values())
    md = subprocess.run(
        [sys.executable, "-m", "arenaflow.instruct.families",
         str(res / "compare/h6/greedy/SD__R3.json")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert len(md.strip().splitlines()) == 2 + 12


def test_the_card_bar_judges_sd_clause_by_clause(built):
    nom = read(built, "nominations/r6.json")
    assert nom["incumbent"] == "R3"
    [sd] = nom["candidates"]
    clauses = {(c["suite"], c["metric"]): c for c in sd["clauses"]}
    h6, probe = (
        read(built, "compare/h6/greedy/SD__R3.json"),
        read(built, "compare/probe/greedy/SD__R3.json"),
    )
    assert clauses[("h6", "delta")]["observed"] == h6["delta"]
    assert clauses[("h6", "family_delta_min")]["observed"] == h6["family_delta_min"]
    assert clauses[("probe", "delta")]["observed"] == probe["delta"]
    holds = [h6["delta"] > 0, h6["family_delta_min"] >= -30.0, probe["delta"] >= 0]
    assert [c["holds"] for c in sd["clauses"]] == holds
    assert nom["promoted"] == ("SD" if all(holds) else "R3")
    page = (built["results"] / "reports/r6/nomination.html").read_text()
    assert "family_delta_min" in page and "probe/greedy" in page
    for fam, r in h6["by_family"].items():  # the per-family table on the page
        assert f"<tr><th>{fam}</th><td class={'no' if r['delta'] < 0 else 'ok'}>" in page
        assert f"{r['delta']:+.1f} ({r['wins']}/{r['losses']}, p " in page


def test_the_null_grid_reads_each_cell_with_its_sign_test(built):
    nom = read(built, "nominations/r7.json")
    r6 = read(built, "nominations/r6.json")["promoted"]
    assert nom["incumbent"] == "r6-nominee"
    assert read(built, "runs/r6-nominee/final/nominee.json")["arm"] == r6
    cells = {c["arm"]: c for c in nom["candidates"]}
    assert set(cells) == set(GRID)
    x1, x2 = (read(built, f"corpora/{m}/stats.json")["rows"] for m in ("mix_x1", "mix_x2"))
    assert x2 > x1  # the doubled mix: twice the prompts, sampled by the same policy
    mix1 = {r["prompt"] for r in rows(built, "pools/if_r6.jsonl")}
    assert mix1 < {r["prompt"] for r in rows(built, "pools/if_r6x2.jsonl")}
    page = (built["results"] / "reports/r7/nomination.html").read_text()
    for arm, (init, mix) in GRID.items():
        ev = read(built, f"runs/{arm}/final/training_evidence.json")
        assert (ev["init"], ev["corpus"]) == (init, mix)
        c = cells[arm]
        comp = read(built, f"compare/h6/greedy/{arm}__r6-nominee.json")
        assert (c["wins"], c["losses"]) == (comp["wins"], comp["losses"])
        n = c["wins"] + c["losses"]
        p = binomtest(c["wins"], n, 0.5).pvalue if n else 1.0
        assert c["p_value"] == pytest.approx(p, abs=1e-12)
        assert f"{c['wins']}/{c['losses']}" in page
    cleared = [a for a, c in cells.items() if c["clears"]]
    assert (nom["promoted"] in cleared) if cleared else nom["promoted"] == "r6-nominee"


def test_the_blinded_read_hides_the_arms_and_its_key_maps_every_pair_back(built):
    """The card's blinded read of the open-chat battery (SD against R3): the judge's packet
    names no arm, the key (a file apart) gives each pair's sides, and each side's text is that
    arm's readout of the item."""
    res = built["results"]
    packet = [json.loads(x) for x in (res / "judged/chat_r6/pairs.jsonl").open()]
    key = read(built, "judged/chat_r6.key.json")
    assert len(packet) == 20 == len(key["pairs"]) and sorted(key["arms"]) == ["R3", "SD"]
    assert all(set(p) == {"pair", "prompt", "A", "B"} for p in packet)
    texts = {
        arm: pd.read_parquet(res / f"readouts/chat/{arm}/greedy.r0.parquet")
        .set_index("item_id")["completion"]
        .to_dict()
        for arm in ("SD", "R3")
    }
    for p in packet:
        k = key["pairs"][p["pair"]]
        assert {k["A"], k["B"]} == {"SD", "R3"}
        assert p["A"] == texts[k["A"]][k["item_id"]] and p["B"] == texts[k["B"]][k["item_id"]]
    sides = [key["pairs"][p["pair"]]["A"] for p in packet]
    assert 0 < sides.count("SD") < len(sides)  # sides swapped at random, not all one way
