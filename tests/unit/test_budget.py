"""The GPU-minute budget: the estimator, the integer program (against known optima and brute
force), and the refusal before anything is submitted (arenaflow.budget.ledger,
arenaflow.budget.plan)."""

from __future__ import annotations

import itertools
import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from dagrun import CONFIG, dry_run

from arenaflow import config as afconfig
from arenaflow import schema as afschema
from arenaflow.budget import cost as afcost
from arenaflow.budget import ledger as afbudget
from arenaflow.budget import plan as afplan
from arenaflow.train import data

REPO = Path(__file__).resolve().parents[2]
MERGES = ["dose-a0p5", "dose-a1p5", "dose-a2", "soup"]  # config/arms: made on CPU, read out on GPUs
# config.yaml's continual rounds r4 and r5: their arms, and the nominees they continue
CONTINUAL = ["r3-nominee", "r4-hi", "r4-lo", "r4-nominee", "r5-hi", "r5-lo"]
HYPER = {"micro_batch_size": 4, "grad_accum": 2, "seq_len": 512, "epochs": 3, "nproc": 2}


@pytest.mark.parametrize(
    "rows,hyper",
    [
        (100, HYPER),
        (7, HYPER),
        (1000, {**HYPER, "max_steps": 5}),
        (64, {**HYPER, "nproc": 1, "epochs": 1}),
        (640, {**HYPER, "nodes": 2}),
        (101, {**HYPER, "nproc": 1, "epochs": 1}),  # 1 row over: joins the last step
        (110, {**HYPER, "nproc": 1, "epochs": 1}),  # 6 rows over: a step of its own
        (984, {**HYPER, "nproc": 1, "micro_batch_size": 512, "grad_accum": 1}),
    ],
)
def test_steps_are_counted_as_the_training_loop_counts_them(rows, hyper):
    world = hyper["nproc"] * hyper.get("nodes", 1)
    assert afcost.train_steps(rows, hyper) == data.total_steps(rows, hyper, world)


def test_training_estimate_is_gpus_times_steps_times_step_time_plus_overhead():
    # 100 rows / (4 x 2 x 2 ranks) = 6 full steps + 4 rows, a step of their own (4 >= 2 x 2
    # micro-batches): 7 steps per epoch x 3 epochs = 21 steps;
    # one step: 0.1 s x 4 x 2 rows x 512/1024 = 0.4 s per rank; 2 GPUs
    assert afcost.train_minutes(100, HYPER, row_seconds=0.1, overhead_minutes=1.0) == pytest.approx(
        2 * (21 * 0.4 / 60 + 1.0)
    )
    two_nodes = {**HYPER, "nodes": 2}  # 4 GPUs, 3 steps per epoch, 9 steps
    assert afcost.train_minutes(100, two_nodes, 0.1, 0.0) == pytest.approx(4 * 9 * 0.4 / 60)


def test_generation_estimate_counts_batches_of_decode_steps():
    # 300 prompts x k 4 = 1200 sequences in batches of 256: 5 batches x 64 steps x 0.05 s
    assert afcost.generate_minutes(300, 4, 256, 64, 0.05, 0.5) == pytest.approx(
        5 * 64 * 0.05 / 60 + 0.5
    )


def test_measured_step_time_inverts_the_model():
    rec = {
        "hyperparameters": HYPER,
        "optimizer_steps": 18,
        "wall_time_s": 18 * 0.4,
        "world_size": 2,
    }
    assert afcost.measured_row_seconds(rec) == pytest.approx(0.1)
    assert afcost.record_minutes(rec, overhead_minutes=1.0) == pytest.approx(2 * (7.2 / 60 + 1.0))


def test_a_preference_row_costs_its_two_sides():
    """DPO/SimPO rows are pairs: a step runs twice the sequences of an SFT step of as many rows,
    and a DPO record's measured seconds are per sequence, so SFT and DPO runs pool."""
    dpo = {**HYPER, "objective": "dpo"}
    assert afcost.row_ktokens(dpo) == 2 * afcost.row_ktokens(HYPER)
    assert afcost.train_minutes(100, dpo, 0.1, 0.0) == pytest.approx(
        2 * afcost.train_minutes(100, HYPER, 0.1, 0.0)
    )
    rec = {"hyperparameters": dpo, "optimizer_steps": 18, "wall_time_s": 18 * 0.8}
    assert afcost.measured_row_seconds(rec) == pytest.approx(0.1)


# ---- a resolved config over a results directory -----------------------------------------
def e2e_config(
    tmp_path: Path, budget: dict | None = None, arm_overrides: dict | None = None
) -> dict:
    arms = tmp_path / "arms"
    shutil.copytree(REPO / "config/arms", arms)
    for arm, extra in (arm_overrides or {}).items():
        data_ = yaml.safe_load((arms / f"{arm}.yaml").read_text())
        (arms / f"{arm}.yaml").write_text(yaml.safe_dump(afschema.merge(data_, extra)))
    raw, _ = afconfig.load_configs(
        [str(REPO / "tests/e2e/config.yaml")],
        [f"results_dir={tmp_path / 'results'}", f"arms_dir={arms}"],
    )
    if budget is not None:
        raw["budget"] = budget
    return afconfig.resolve(raw)


def evidence(
    results: Path, arm: str, wall: float, steps: int, hyper: dict, base="arenaflow/tiny-arith"
):
    d = results / "runs" / arm / "final"
    d.mkdir(parents=True)
    (d / "training_evidence.json").write_text(
        json.dumps(
            {
                "arm": arm,
                "job_id": f"j{arm}",
                "dataset_sha256": "x",
                "base_model": base,
                "hyperparameters": hyper,
                "optimizer_steps": steps,
                "wall_time_s": wall,
                "world_size": hyper["nproc"],
            }
        )
    )


def test_history_calibrates_step_time_and_counts_as_spent(tmp_path):
    cfg = e2e_config(
        tmp_path,
        {
            "gpu_minutes": 100,
            "spent_gpu_minutes": 10,
            "estimate": {"row_seconds": 9.0, "overhead_minutes": 0.5},
        },
    )
    results = tmp_path / "results"
    b = afbudget.Budget(cfg, results=results)
    assert b.row_seconds() == (9.0, "prior (estimate.row_seconds)")
    s1 = cfg["arms"]["S1"]["hyper"]  # e2e: micro 8 x accum 1 x seq 256 = 2 rows of 1024 per step
    evidence(results, "S1", wall=4 * 2 * 0.3, steps=4, hyper=s1)
    evidence(results, "R220", wall=4 * 2 * 0.5, steps=4, hyper=cfg["arms"]["R220"]["hyper"])
    evidence(
        results, "R2d", wall=4 * 2 * 0.4, steps=4, hyper=cfg["arms"]["R2d"]["hyper"], base="other"
    )
    b.refresh()
    seconds, where = b.row_seconds()
    assert seconds == pytest.approx(0.4) and "2 measured runs of arenaflow/tiny-arith" in where
    spent = b.spent()
    assert spent["runs"] == 3 and spent["before"] == 10
    assert spent["training_measured"] == pytest.approx((2.4 + 4.0 + 3.2) / 60 + 3 * 0.5)
    assert b.left() == pytest.approx(100 - spent["total"])
    assert b.pending_arms() == sorted(["B1", "B2", "B3", "B4", *MERGES, *CONTINUAL])
    # the pending B-arms train on rft_r3 (a 64-prompt pool before the corpus exists: 8 steps,
    # capped at max_steps 4 by tests/e2e/config.yaml)
    e = b.estimate("B1")
    assert (e.rows, e.steps, e.needs) == (64, 4, [])
    soup = b.estimate("soup")  # no training: its readouts only, and it waits for B3 and B2
    assert (soup.train, soup.sampling, soup.needs) == (0.0, 0.0, ["B3", "B2"])
    assert soup.readouts == pytest.approx(e.readouts) and soup.readouts > 0
    assert e.train == pytest.approx(1 * (4 * 0.4 * 2 / 60 + 0.5))
    (results / "corpora/rft_r3").mkdir(parents=True)
    (results / "corpora/rft_r3/stats.json").write_text(json.dumps({"rows": 40}))
    b.refresh()
    assert b.estimate("B1").rows == 40  # the built corpus's row count replaces the pool's


def test_a_readout_is_estimated_at_the_max_new_tokens_it_decodes_with(tmp_path):
    cfg = e2e_config(tmp_path, {"gpu_minutes": 1000, "estimate": {"overhead_minutes": 0.0}})
    b = afbudget.Budget(cfg)
    greedy = cfg["evals"]["math"]["regimes"]["greedy"]
    at_48 = b.readout("math", "greedy")
    del greedy["max_new_tokens"]  # the readout then decodes with the schema's default
    assert b.readout("math", "greedy") == pytest.approx(
        at_48 * afschema.schema_defaults("regime")["max_new_tokens"] / 48
    )


def test_a_shared_corpus_is_sampled_once_in_a_cost(tmp_path):
    b = afbudget.Budget(e2e_config(tmp_path, {"gpu_minutes": 1000}))
    e1, e2 = b.estimate("B1"), b.estimate("B2")
    assert e1.corpus == e2.corpus == "rft_r3" and e1.sampling > 0 and e1.needs == ["R2d"]
    assert b.cost(["B1", "B2"]) == pytest.approx(e1.own + e2.own + e1.sampling)


# ---- the integer program ----------------------------------------------------------------
def est(arm, own, priority=1.0, needs=(), corpus=None, sampling=0.0):
    return afcost.ArmEstimate(
        arm=arm,
        priority=priority,
        gpus=1,
        rows=0,
        steps=0,
        train=own,
        readouts=0.0,
        corpus=corpus or f"c_{arm}",
        sampling=sampling,
        needs=list(needs),
    )


def test_ilp_beats_greedy_by_priority_on_a_known_optimum():
    # greedy by priority takes A (8) and then nothing fits; the optimum is B + C (priority 10)
    ests = {
        "A": est("A", 8, priority=6),
        "B": est("B", 5, priority=5),
        "C": est("C", 5, priority=5),
    }
    assert afplan.choose(ests, left=10) == {"B", "C"}


def test_ilp_respects_lineage_and_shared_sampling():
    # D needs P; P is cheap but worthless alone; D+P (priority 9) beats E (priority 8)
    ests = {
        "P": est("P", 3, priority=1),
        "D": est("D", 4, priority=8, needs=["P"]),
        "E": est("E", 7, priority=8),
    }
    assert afplan.choose(ests, left=7) == {"P", "D"}
    assert afplan.choose({"D": ests["D"], "E": ests["E"]}, left=100) == {
        "E"
    }  # D's need is not a candidate
    # two arms on one corpus pay its sampling once: 4 + 4 + 3 = 11 fits, 4 + 3 + 4 + 3 would not
    shared = {
        "X": est("X", 4, corpus="c", sampling=3),
        "Y": est("Y", 4, corpus="c", sampling=3),
        "Z": est("Z", 4, corpus="z", sampling=3),
    }
    assert afplan.choose(shared, left=11) == {"X", "Y"}


def test_ilp_prefers_the_cheaper_set_among_equal_priorities():
    ests = {"A": est("A", 6), "B": est("B", 4)}
    assert afplan.choose(ests, left=7) == {"B"}


def test_ilp_matches_brute_force_on_random_instances():
    rng = random.Random(7)
    for _ in range(25):
        names = [f"a{i}" for i in range(6)]
        ests = {}
        for i, a in enumerate(names):
            needs = [names[j] for j in range(i) if rng.random() < 0.2]
            ests[a] = est(
                a,
                rng.randint(1, 9),
                priority=rng.randint(1, 5),
                needs=needs,
                corpus=f"c{rng.randint(0, 2)}",
                sampling=rng.choice([0, 2]),
            )
        for e in ests.values():  # one sampling cost per corpus
            e.sampling = max(x.sampling for x in ests.values() if x.corpus == e.corpus)
        left = rng.randint(5, 30)

        def cost(sub, ests=ests):
            return sum(ests[a].own for a in sub) + sum(
                {ests[a].corpus: ests[a].sampling for a in sub}.values()
            )

        best = max(
            (
                sub
                for r in range(len(names) + 1)
                for sub in itertools.combinations(names, r)
                if all(set(ests[a].needs) <= set(sub) for a in sub) and cost(sub) <= left
            ),
            key=lambda sub: (sum(ests[a].priority for a in sub), -cost(sub)),
        )
        got = afplan.choose(ests, left)
        assert sum(ests[a].priority for a in got) == sum(ests[a].priority for a in best)
        assert cost(got) == pytest.approx(cost(best)) and cost(got) <= left


def test_plan_cli_lists_pending_arms_and_picks_by_priority(tmp_path, capsys):
    cfg_file = tmp_path / "budget.yaml"
    cfg_file.write_text(
        yaml.safe_dump({"budget": {"gpu_minutes": 13, "estimate": {"overhead_minutes": 1.0}}})
    )
    arms = tmp_path / "arms"
    shutil.copytree(REPO / "config/arms", arms)
    args = [
        "--configfile",
        str(REPO / "config/config.yaml"),
        str(REPO / "tests/e2e/config.yaml"),
        str(cfg_file),
        "--config",
        f"results_dir={tmp_path / 'r'}",
        f"arms_dir={arms}",
    ]
    assert afplan.main([*args, "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert {e["arm"] for e in p["pending"]} == {
        "S1",
        "R220",
        "R2d",
        "B1",
        "B2",
        "B3",
        "B4",
        *MERGES,
        *CONTINUAL,
    }
    assert p["left"] == 13 and p["chosen_cost"] <= 13
    assert p["chosen"] == ["R220", "S1"]  # a lineage prefix: R220 needs S1; R2d would not fit
    assert afplan.main(args) == 0
    text = capsys.readouterr().out
    assert "chosen: R220 S1" in text and "run: snakemake runs/R220/final runs/S1/final" in text


# ---- the refusal --------------------------------------------------------------------------
def test_check_names_the_arm_its_estimate_and_the_budget_left(tmp_path):
    b = afbudget.Budget(e2e_config(tmp_path, {"gpu_minutes": 7, "spent_gpu_minutes": 1}))
    b.check({"S1"}, "S1")  # S1 alone (about 5.2: training and four readouts) fits in 6
    with pytest.raises(afbudget.BudgetError) as e:
        b.check({"S1", "R220"}, "R220")
    msg = str(e.value)
    r220 = b.estimate("R220")
    assert "arm 'R220'" in msg and f"{r220.own + r220.sampling:.1f} GPU-minutes" in msg
    assert "6.0 of 7.0 GPU-minutes are left" in msg and "(S1)" in msg


def test_the_gate_costs_an_arm_with_its_lineage_and_its_rounds_other_arms(tmp_path):
    b = afbudget.Budget(e2e_config(tmp_path, {"gpu_minutes": 8}))
    assert b.gate_arms("S1") == ["S1"]
    assert b.gate_arms("R220") == ["R220", "S1"]
    assert b.gate_arms("R2d") == ["R220", "R2d", "S1"]  # an incumbent: its lineage only
    everyone = ["B1", "B2", "B3", "B4", "R220", "R2d", "S1", *MERGES]
    assert [b.gate_arms(a) for a in ("B1", "B4")] == [everyone, everyone]  # a candidate: the round


def snakemake_dry(tmp_path: Path, target: str, budget: dict, env=None):
    arms = tmp_path / "arms"
    if not arms.exists():
        shutil.copytree(REPO / "config/arms", arms)
    extra = tmp_path / "budget.yaml"
    extra.write_text(yaml.safe_dump({"budget": budget}))
    cmd = dry_run(
        target,
        "--cores",
        "1",
        results=tmp_path / "results",
        arms=arms,
        configfiles=(*CONFIG, extra),
    )
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=330, env=env)


def test_the_workflow_refuses_a_run_over_budget_before_submitting_anything(tmp_path):
    proc = snakemake_dry(tmp_path, "runs/R2d/final", {"gpu_minutes": 8})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "would overrun the budget" in out and "8.0 of 8.0 GPU-minutes are left" in out, out[
        -3000:
    ]
    assert re.search(r"arm '(S1|R220|R2d)'", out) and "Nothing was submitted" in out
    assert not (tmp_path / "results" / "pools").exists()
    ok = snakemake_dry(tmp_path, "runs/S1/final", {"gpu_minutes": 8})
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    assert "train_arm" in ok.stdout
