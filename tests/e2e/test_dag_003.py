"""Lineage 003 through Snakemake on CPU (the `dag` tier): config/seeds/003.yaml, standalone
(merge_over: null), at toy scale on the tiny model. Full fine-tunes on mixtures of corpora, the
step-dose sweep, the GPU-minute cap refusing the lowest-priority 4-GPU arm while the rest of the
lineage runs, and the three tables of the card's report checked against the files they were
made from: the budget table, the failure analysis by checker reason and the prompt search.
About 2 minutes on 2 cores.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from dagrun import REPO, build, planned_jobs

from arenaflow.budget import ledger as afbudget
from arenaflow.evals import readout_file

pytestmark = pytest.mark.dag

CONFIG = (REPO / "config/seeds/003.yaml",)
SWEEP = {"LA2b100": 2, "LA2b200": 4, "LA2b300": 6}  # the card's 100/200/300 steps, scaled down
TARGETS = (
    "all",
    "failures/ifeval/greedy/LA2b200__b1.json",
    "prompt_search/k.json",
    "guards/mc/LA2b200.json",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build(
        tmp_path_factory.mktemp("lineage003"), CONFIG, TARGETS, REPO / "config/seeds/003/arms"
    )


def read(built, path):
    return json.loads((built["results"] / path).read_text())


def readout(built, arm, regime="greedy"):
    return pq.read_table(
        built["results"] / f"readouts/ifeval/{arm}/{regime}.r0.parquet"
    ).to_pylist()


def test_the_standalone_config_reads_nothing_of_lineage_000(built):
    jobs = planned_jobs(built["dry"])
    assert not any("math_eval" in w or "rft_r" in w for _, w in jobs)
    trained = sorted(w.split("=")[1] for r, w in jobs if r == "train_arm")
    assert trained == ["LA2b100", "LA2b200", "LA2b300", "b1"]  # smk refused before the DAG
    out = built["dry"].stdout + built["dry"].stderr
    assert "round la judges without smk (AssocGrpGRESMinutes" in out


def test_full_fine_tunes_on_mixtures_record_each_source(built):
    ev = read(built, "runs/b1/final/training_evidence.json")
    assert ev["hyperparameters"]["method"] == "full" and ev["hyperparameters"]["packing"]
    assert ev["world_size"] == 2  # ZeRO-3 over two ranks, each taking the same mixture's rows
    for src in ev["mixture"]:  # tulu3:all,smoltalk:all: every row of each, as its build counted
        stats = read(built, f"corpora/{src['corpus']}/stats.json")
        assert (src["rows"], src["tokens"]) == (stats["rows"], stats["tokens"])
        assert src["supervised_tokens"] == stats["supervised_tokens"]
        manifest = read(built, f"corpora/{src['corpus']}/manifest.json")
        assert src["digest"] == manifest["digest"]
    assert [s["corpus"] for s in ev["mixture"]] == ["tulu3", "smoltalk"]
    for arm, steps in SWEEP.items():  # the step-dose sweep: the same recipe, more steps
        ev = read(built, f"runs/{arm}/final/training_evidence.json")
        assert ev["optimizer_steps"] == steps and ev["init"] == "b1"
        (src,) = ev["mixture"]
        assert (
            src["rows"] == 24
            and src["rows_available"] == read(built, "corpora/iflensyn/stats.json")["rows"]
        )


def test_b1_holds_rows_out_and_records_their_loss_during_training(built):
    """seeds/000's held-out rows (150 there, 16 here): logged while b1 trains, in the evidence."""
    ev = read(built, "runs/b1/final/training_evidence.json")
    h = ev["heldout"]
    assert h["rows"] == 16 == len(set(h["row_indices"])) and h["supervised_tokens"] > 0
    steps = [m for m in map(json.loads, (built["results"] / "runs/b1/metrics.jsonl").open())]
    logged = [(m["step"], m["heldout_loss"]) for m in steps if "heldout_loss" in m]
    assert logged == [(c["step"], c["loss"]) for c in h["curve"]] and len(logged) >= 2
    assert logged[-1][0] == ev["optimizer_steps"] and h["final_loss"] == logged[-1][1]
    total = sum(s["rows"] for s in ev["mixture"])
    assert all(0 <= i < total for i in h["row_indices"])


def test_the_budget_table_shows_the_cap_each_arms_cost_and_the_refusal(built):
    t = read(built, "budget/table.json")
    assert t["cap_gpu_minutes"] == 60000 and t["spent"]["before"] == 59983
    assert t["refused"] == ["smk"] and not (built["results"] / "runs/smk").exists()
    rows = {r["arm"]: r for r in t["arms"]}
    over = afbudget.schema_defaults("estimate")["overhead_minutes"]
    for arm in ["b1", *SWEEP]:
        ev = read(built, f"runs/{arm}/final/training_evidence.json")
        assert rows[arm]["status"] == "ran" and rows[arm]["steps"] == ev["optimizer_steps"]
        # measured: every rank's GPU for the run's wall time, plus the per-job overhead
        assert rows[arm]["training_measured"] == pytest.approx(
            ev["world_size"] * (ev["wall_time_s"] / 60 + over)
        )
    # the jobs LA2b200 caused, measured from what they recorded (the table waits for them)
    la = rows["LA2b200"]
    meta = [
        readout_file.readout_meta(
            built["results"] / f"readouts/ifeval/LA2b200/greedy-{k}.r0.parquet"
        )
        for k in ("none", "k0", "k0h", "k0m")
    ]
    assert la["search_readouts"] == pytest.approx(sum(m["seconds"] / 60 + over for m in meta))
    guard = read(built, "guards/mc/LA2b200.json")
    assert la["mc_guards"] == pytest.approx(guard["seconds"] / 60 + over)
    assert t["spent"]["search_readouts_measured"] == pytest.approx(la["search_readouts"])
    assert t["spent"]["mc_guards_measured"] == pytest.approx(la["mc_guards"])
    assert la["cost"] == pytest.approx(
        la["training_measured"] + la["readouts_estimated"] + la["search_readouts"] + la["mc_guards"]
    )
    smk = rows["smk"]
    assert (
        smk["status"] == "refused" and smk["gpus"] == 4 and "AssocGrpGRESMinutes" in smk["reason"]
    )
    assert smk["gpu_minutes"] > t["left"]  # it would take the association over the cap
    assert t["spent"]["total"] <= t["cap_gpu_minutes"]
    assert (
        "| smk | iflensyn:24,tulu3:24 | refused | 4 |"
        in (built["results"] / "budget/table.md").read_text()
    )
    page = (built["results"] / "budget/table.html").read_text()  # a page of --report
    assert "<tr class=no><th>smk</th>" in page and page.count("<tr class=ok>") == 4
    nom = read(built, "nominations/la.json")
    assert [c["arm"] for c in nom["candidates"]] == list(SWEEP)


def test_the_failure_table_counts_what_the_readouts_say(built):
    f = read(built, "failures/ifeval/greedy/LA2b200__b1.json")
    cand, ref = readout(built, "LA2b200"), readout(built, "b1")
    pool = {r["id"]: r for r in map(json.loads, (built["results"] / "pools/if_eval.jsonl").open())}
    assert f["all"]["prompts"] == len(cand) == len(pool)
    # a prompt fails when a check gives a reason (a truncated answer that passes every check is
    # not correct in the readout, but no check failed: the table counts checks)
    fails = {r["item_id"]: bool(r["reasons"]) for r in cand}
    ref_fails = {r["item_id"]: bool(r["reasons"]) for r in ref}
    assert f["all"]["failing"] == sum(fails.values())
    assert f["all"]["fixed"] == sum(ref_fails[i] and not x for i, x in fails.items())
    assert f["all"]["lost"] == sum(x and not ref_fails[i] for i, x in fails.items())
    for row in f["table"]:
        fam = row["family"]
        carrying = [i for i, p in pool.items() if any(c["type"] == fam for c in p["constraints"])]
        failing = [
            r
            for r in cand
            if any(x.startswith(f"{fam}:") for x in (r["reasons"] or "").split("; "))
        ]
        assert (row["carrying"], row["failing"]) == (len(carrying), len(failing)), fam
    assert {"word_eq", "word_times"} <= {r["family"] for r in f["table"]}
    # the readout's incorrect rows, each under one reason: a cut-off answer under truncated
    # whatever its checks, the others by the checks they failed; no correct row
    for part, rows in ((f["incorrect"], cand), (f["ref_incorrect"], ref)):
        wrong = [r for r in rows if not r["correct"]]
        assert part["incorrect"] == sum(part["by_reason"].values()) == len(wrong)
        assert part["by_reason"].get("truncated", 0) == sum(not r["stopped"] for r in wrong)


def test_the_prompt_search_counts_each_prompts_readout(built):
    p = read(built, "prompt_search/k.json")
    table = {r["prompt"]: r for r in p["table"]}
    assert set(table) == {"none", "k0", "k0h", "k0m"} and p["arm"] == "LA2b200"
    for key, row in table.items():
        rows = readout(built, "LA2b200", f"greedy-{key}")
        assert row["correct"] == sum(r["correct"] for r in rows) and row["n"] == len(rows)
    best = max(r["correct"] for r in table.values())  # no prompt is a candidate too
    assert table[p["chosen"]]["correct"] == best
    if table["none"]["correct"] == best:  # a tie goes to none
        assert p["chosen"] == "none"


def test_the_bundle_serves_the_nominee_with_the_chosen_prompt_and_its_mixture_checked(built):
    nom = read(built, "nominations/la.json")
    b = built["results"] / "bundles/LA"
    ev = json.loads((b / "training_evidence.json").read_text())
    assert ev["arm"] == nom["promoted"]
    assert (b / "system_prompt.txt").read_text().strip() == read(built, "prompt_search/k.json")[
        "chosen_text"
    ]
    checks = json.loads((b / "checks.json").read_text())
    if "mixture" in ev:  # b1 (tulu3:all,smoltalk:all) or a sweep arm (iflensyn:24)
        assert checks["evidence"]["verdict"] == "PASS"
        assert "the mixture's of" in checks["evidence"]["detail"]
