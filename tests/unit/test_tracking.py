"""Experiment trackers (arenaflow.tracking): a tiny CPU training written to TensorBoard and MLflow
and read back with their own readers; trackers that fail warn once and never fail the job."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest
from hypers import TINY_ARM

from arenaflow import manifest, schema, tracking
from arenaflow.bases import tinymodel
from arenaflow.corpora import build as corpora
from arenaflow.pools import math as mathpool
from arenaflow.train import argv as train_argv

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "models/tiny-arith"
# 24 rows, 4 held out: 20 / (4 micro x 1 accum) = 5 steps; held out every 2 steps and at the end
HYPER = {**TINY_ARM, "heldout_rows": 4, "heldout_every": 2}
STEPS = 5


def read_events(run_dir: Path) -> dict:
    """{tag: [steps]} of a TensorBoard run directory, through tensorboard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {t: [e.step for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def wait_idle(run: tracking.Run, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(w.idle() for w in run.workers) and time.monotonic() < deadline:
        time.sleep(0.05)


def mlflow_runs(uri: str) -> list:
    from arenaflow.tracking.to_mlflow import client

    c = client(uri)
    return c.search_runs([c.get_experiment_by_name("arenaflow").experiment_id])


def train(tmp: Path, settings: dict | None, arm: str = "A") -> subprocess.CompletedProcess:
    corpus = tmp / "corpora" / "c"
    if not corpus.exists():
        rows = mathpool.generate(24, 3, "train", {"add": 1, "mul": 1}, "t")
        corpora.build(corpus, rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {})
    flag = ["--tracking-json", json.dumps(settings)] if settings else []
    proc = subprocess.run(
        train_argv(arm, HYPER, corpus, BASE, tmp / "runs" / arm / "final", extra=flag),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return proc


# Each CPU training takes ~30 s on 2 busy cores: these run in the resume tier, which CI runs
# (python -m pytest -m ranks); the default tier checks the same call sites in-process below.
TRAINED = pytest.mark.ranks


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """Arm A trained with TensorBoard and MLflow (the file store), as the workflow resolves them."""
    tmp = tmp_path_factory.mktemp("tracked")
    s = tracking.settings({"backends": ["tensorboard", "mlflow"], "lineage": "L"}, tmp)
    proc = train(tmp, s)
    return tmp, s, proc


@TRAINED
def test_tensorboard_events_have_every_training_tag_at_every_step(tracked):
    tmp, s, proc = tracked
    tags = read_events(Path(s["tensorboard"]["dir"]) / "L" / "A")
    every = list(range(1, STEPS + 1))
    for tag in ("loss", "grad_norm", "tokens_per_s", "tokens_seen", "lr/lora"):
        assert tags[f"train/{tag}"] == every, tag
    assert tags["train/heldout_loss"] == [2, 4, 5]  # heldout_every 2, and the last step
    metrics = [json.loads(x) for x in (tmp / "runs/A/final/metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == STEPS
    assert "tracker" not in proc.stderr  # no warning from a working tracker


@TRAINED
def test_mlflow_store_holds_one_run_for_the_arm_with_its_params_and_curves(tracked):
    tmp, s, _ = tracked
    from arenaflow.tracking.to_mlflow import client

    (run,) = mlflow_runs(s["mlflow"]["tracking_uri"])
    assert run.info.run_name == "L/A" and run.info.status == "FINISHED"
    p = run.data.params
    assert json.loads(p["lr"]) == HYPER["lr"] and json.loads(p["seq_len"]) == HYPER["seq_len"]
    corpus = tmp / "corpora" / "c"
    assert p["manifest_sha256"] == manifest.sha256_file(corpus / "manifest.json")
    assert p["dataset_sha256"] == manifest.verify(corpus)["digest"]
    assert run.data.tags["corpus"] == "c" and run.data.tags["kind"] == "train"
    history = client(s["mlflow"]["tracking_uri"]).get_metric_history(run.info.run_id, "train/loss")
    evidence = json.loads((tmp / "runs/A/final/metrics.jsonl").read_text().splitlines()[-1])
    assert [m.step for m in history] == list(range(1, STEPS + 1))
    assert history[-1].value == pytest.approx(evidence["loss"])


def test_a_backend_whose_package_is_missing_is_refused_naming_package_and_extra(monkeypatch):
    monkeypatch.setitem(tracking.PACKAGES, "wandb", ("no_such_wandb_pkg", "wandb"))
    with pytest.raises(schema.ConfigError) as e:
        tracking.settings({"backends": ["wandb"]}, "/tmp/r", "cfg.yaml")
    msg = str(e.value)
    assert "cfg.yaml: key 'tracking/backends'" in msg
    assert "'no_such_wandb_pkg'" in msg and "arenaflow[wandb]" in msg


def test_the_default_is_tensorboard_under_results_with_mlflow_s_store_beside_it():
    s = tracking.settings(None, "/x/results-002")
    assert s["backends"] == ["tensorboard"] and s["lineage"] == "results-002"
    assert s["tensorboard"]["dir"] == "/x/results-002/tensorboard"
    assert s["mlflow"]["tracking_uri"] == "file:///x/results-002/mlruns"


@TRAINED
def test_failing_trackers_warn_once_each_and_the_training_completes(tmp_path):
    """An unwritable TensorBoard directory and an MLflow server that does not answer (a closed
    loopback port): one warning each, and the run's outputs are complete."""
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the directory should be")
    s = tracking.settings(
        {
            "backends": ["tensorboard", "mlflow"],
            "tensorboard": {"dir": str(blocked / "tb")},
            "mlflow": {"tracking_uri": "http://127.0.0.1:9"},
        },
        tmp_path,
    )
    proc = train(tmp_path, s)
    warnings = [line for line in proc.stderr.splitlines() if "arenaflow.tracking" in line]
    assert len([w for w in warnings if "tracker tensorboard" in w]) == 1, warnings
    assert len([w for w in warnings if "tracker mlflow" in w]) == 1, warnings
    assert manifest.verify(tmp_path / "runs/A/final")


def stalled():
    time.sleep(60)


def test_a_stalled_tracker_holds_the_job_at_most_1_percent_of_its_time(caplog, monkeypatch):
    """A backend that never answers: logging returns at once, and close() waits at most 1 % of
    the run's time (the floor for short runs aside), then warns once."""
    monkeypatch.setattr(tracking.run, "MIN_WAIT_S", 0.0)
    run = tracking.Run([tracking.run.Worker("stalled", stalled)], 1, 0.0)
    t0 = time.perf_counter()
    for step in range(1000):
        run.log_metrics({"train/loss": 1.0}, step)
    per_call = (time.perf_counter() - t0) / 1000
    time.sleep(1.0)  # the job's work
    t1 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="arenaflow.tracking"):
        run.close()
    took = time.perf_counter() - t1
    # 1 % of ~1 s, plus the scheduler's wake-up on a busy machine (25 ms seen at load 13)
    assert per_call < 1e-3 and took <= 0.01 * (t1 - t0) + 0.05
    (warning,) = [r.message for r in caplog.records if "tracker stalled" in r.message]
    assert "did not finish within" in warning


def test_backends_flush_together_and_a_short_run_gives_them_the_floor(caplog, monkeypatch):
    """Two stalled backends and a run of no time: close() waits MIN_WAIT_S once, not once per
    backend, and each warns."""
    monkeypatch.setattr(tracking.run, "MIN_WAIT_S", 0.5)
    run = tracking.Run([tracking.run.Worker(n, stalled) for n in ("a", "b")], 1, 0.0)
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="arenaflow.tracking"):
        run.close()
    took = time.perf_counter() - t0
    assert 0.5 <= took < 0.9, took
    warned = [r.message for r in caplog.records if "did not finish within 0.50 s" in r.message]
    assert len(warned) == 2, warned


def test_the_throttle_logs_every_n_steps_at_most_so_often_and_always_when_forced(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(tracking.run.time, "monotonic", lambda: now[0])
    t = tracking.Throttle(every_steps=2, min_interval_s=5.0)
    logged = []
    for step in range(1, 21):
        now[0] = step * 1.0  # one step a second
        if t.due(step, force=step == 20):
            logged.append(step)
    assert logged == [2, 8, 14, 20]


def test_no_backend_is_a_run_that_writes_nothing_and_starts_no_thread():
    run = tracking.open_run({"backends": []}, "A", kind="train")
    assert not run and run.workers == []
    run.log_metrics({"x": 1}, 1)
    run.close()


def test_progress_sends_each_step_to_tensorboard_with_lrs_rate_and_heldout(tmp_path):
    """The training's one call site (train.progress.Progress) through a real TensorBoard writer,
    read back with tensorboard's reader: every step, the held-out loss where it was evaluated."""
    from arenaflow.train.progress import Progress

    s = tracking.settings(None, tmp_path)
    run = tracking.open_run(s, "A", kind="train", params={"lr": 1e-3})
    progress = Progress(tmp_path / "metrics.jsonl", [], 0, 4, 0, run)
    for step in range(1, 5):
        m = {"step": step, "loss": 1.0 / step, "grad_norm": 0.5, "tokens_seen": 100 * step}
        m |= {"heldout_loss": 2.0} if step % 2 == 0 else {}
        progress.step({**m, "elapsed_s": step}, {"lora": 1e-3, "lm_head": 1e-4})
    wait_idle(run)  # a real training's steps take the writer's start-up time many times over
    progress.close()
    tags = read_events(Path(s["tensorboard"]["dir"]) / s["lineage"] / "A")
    for tag in ("loss", "grad_norm", "tokens_per_s", "lr/lora", "lr/lm_head"):
        assert tags[f"train/{tag}"] == [1, 2, 3, 4], tag
    assert tags["train/heldout_loss"] == [2, 4]


def test_pass_at_k_counts_prompts_with_any_correct_sample():
    from arenaflow.candidates import pass_at

    verdicts = [
        {"prompt_id": p, "correct": c}
        for p, cs in {"a": [1, 0, 0, 0], "b": [0, 0, 0, 0], "c": [1, 1, 1, 1]}.items()
        for c in cs
    ]
    got = pass_at(verdicts)
    assert got["verify/pass@1"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert got["verify/pass@4"] == pytest.approx(2 / 3) and got["verify/prompts"] == 3


def test_readout_accuracy_interval_is_wilson_s():
    import numpy as np
    from statsmodels.stats.proportion import proportion_confint

    from arenaflow.evals.readout import tracked_numbers

    correct = np.array([True] * 37 + [False] * 63)
    got = tracked_numbers("readout/math/greedy", correct, 50.0)
    low, high = proportion_confint(37, 100, alpha=0.05, method="wilson")
    assert got["readout/math/greedy/accuracy"] == 0.37
    assert got["readout/math/greedy/accuracy_ci95_low"] == pytest.approx(low)
    assert got["readout/math/greedy/accuracy_ci95_high"] == pytest.approx(high)


def test_a_round_is_a_parent_run_with_a_child_run_per_candidate_arm(tmp_path):
    """The round's summary in MLflow's file store, read back with MlflowClient: the parent run
    <lineage>/<round>, a child per candidate with its comparison's numbers."""
    from arenaflow.rounds import tracked as round_tracked
    from arenaflow.tracking.to_mlflow import PARENT_TAG

    s = tracking.settings({"backends": ["mlflow"], "lineage": "L"}, tmp_path)
    verdict = {"delta": 2.5, "wins": 9, "losses": 4, "p_value": 0.27, "ci95": [-1.0, 6.0]}
    result = {
        "round": "r3",
        "suite": "math",
        "regime": "greedy",
        "incumbent": "R2d",
        "bar_sha256": "ab" * 32,
        "promoted": "B3",
        "reason": "B3 clears every clause",
        "candidates": [
            {"arm": "B3", "clears": True, "failed": [], **verdict},
            {"arm": "B1", "clears": False, "failed": [1], **verdict, "delta": -1.0},
        ],
    }
    round_tracked.track(s, result)
    runs = {r.info.run_name: r for r in mlflow_runs(s["mlflow"]["tracking_uri"])}
    assert sorted(runs) == ["L/r3", "L/r3/B1", "L/r3/B3"]
    parent = runs["L/r3"]
    assert parent.data.tags["promoted"] == "B3" and parent.data.metrics["round/cleared"] == 1
    assert parent.data.params["bar_sha256"] == "ab" * 32
    for arm, delta in (("B3", 2.5), ("B1", -1.0)):
        child = runs[f"L/r3/{arm}"]
        assert child.data.tags[PARENT_TAG] == parent.info.run_id
        assert child.data.metrics["round/delta"] == delta
        assert child.data.metrics["round/delta_ci95_high"] == 6.0


def test_an_unwritable_directory_and_a_silent_server_each_warn_once(tmp_path, caplog):
    """Without a training: a TensorBoard directory under a file, an MLflow server on a closed
    loopback port; logging goes on, close() returns within its bound, one warning each."""
    blocked = tmp_path / "blocked"
    blocked.write_text("")
    s = tracking.settings(
        {
            "backends": ["tensorboard", "mlflow"],
            "tensorboard": {"dir": str(blocked / "tb")},
            "mlflow": {"tracking_uri": "http://127.0.0.1:9"},
        },
        tmp_path,
    )
    with caplog.at_level(logging.WARNING, logger="arenaflow.tracking"):
        run = tracking.open_run(s, "A", kind="train", params={"lr": 1})
        for step in range(50):
            run.log_metrics({"train/loss": 1.0}, step)
        time.sleep(0.5)
        t0 = time.perf_counter()
        run.close(1.0)
        assert time.perf_counter() - t0 < 1.1
        run.close(0.0)  # a second close warns no more
    warned = [r.message for r in caplog.records]
    assert sum("tracker tensorboard" in w for w in warned) == 1, warned
    assert sum("tracker mlflow" in w for w in warned) == 1, warned


def test_the_rules_get_only_the_asked_for_backends_settings_and_none_without_one():
    import shlex

    from arenaflow.dag import stages

    s = tracking.settings({"backends": ["tensorboard"]}, "/r")
    flag = stages.tracking_flag({"tracking": s})
    opt, value = shlex.split(str(flag))
    assert opt == "--tracking-json"
    assert set(json.loads(value)) == {
        "backends",
        "lineage",
        "every_steps",
        "min_interval_s",
        "flush_s",
        "tensorboard",
    }
    assert str(stages.tracking_flag({"tracking": {**s, "backends": []}})) == ""


def test_the_trackers_flag_is_formatted_into_a_command_and_left_out_of_snakemakes_params_trigger():
    """Snakemake reruns a job whose params changed, comparing the params it can represent; the
    trackers' flag is one it cannot, so a tracking edit reruns nothing."""
    from snakemake.persistence import UNREPRESENTABLE
    from snakemake.persistence import PersistenceBase as Persistence

    from arenaflow.dag import stages

    s = tracking.settings({"backends": ["tensorboard"]}, "/r")
    flag = stages.tracking_flag({"tracking": s})
    assert Persistence._serialize_param_builtin(None, flag) is UNREPRESENTABLE
    builtin = type("P", (), {"_serialize_param_builtin": Persistence._serialize_param_builtin})
    assert Persistence._serialize_param_pandas(builtin(), flag) is UNREPRESENTABLE  # pandas here
    assert Persistence._serialize_param_builtin(None, str(flag)) is not UNREPRESENTABLE
    cmd = "train --out x {params.tracking} > log".format(params=type("P", (), {"tracking": flag}))
    assert cmd == f"train --out x {flag.text} > log" and "--tracking-json" in cmd
