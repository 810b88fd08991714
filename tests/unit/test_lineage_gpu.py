"""benchmarks/lineage_gpu.py's report, from a made-up run's files: Snakemake's timed output, the
jobs' events (arenaflow.jobclock), the GPU samples, a training run's metrics and a sampling
log; and the whole script once on CPU (--smoke: the tiny model at the mini DAG's sizes, -m dag)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from arenaflow import jobclock

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("lineage_gpu", REPO / "benchmarks/lineage_gpu.py")
lg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lg)

T0 = 1_000_000.0
START = {"process_start": T0 + 1.2}  # train_arm S1's
SNAKEMAKE = [
    (0.5, "[Tue Dec  1 02:37:37 2026]"),
    (0.5, "localrule build_pool:"),
    (0.5, "    output: pools/sft_s1.jsonl"),
    (0.5, "    log: logs/pools/sft_s1.log"),
    (0.5, "    jobid: 3"),
    (0.5, "    wildcards: pool=sft_s1"),
    (1.0, "[Tue Dec  1 02:37:38 2026]"),
    (1.0, "localrule train_arm:"),
    (1.0, "    output: runs/S1/final (update)"),  # as Snakemake prints a flagged output
    (1.0, "    log: logs/train/S1.log"),
    (1.0, "    jobid: 7"),
    (1.0, "    wildcards: arm=S1"),
    (1.5, "[Tue Dec  1 02:37:38 2026]"),
    (1.5, "Finished jobid: 3 (Rule: build_pool)"),
    (1.5, "1 of 3 steps (33%) done"),
    (2.0, "localrule sample_candidates:"),
    (
        2.0,
        "    output: candidates/rft_r1/samples.jsonl (update), "
        "candidates/rft_r1/samples.manifest.json (update)",
    ),
    (2.0, "    log: logs/candidates/rft_r1.sample.log"),
    (2.0, "    jobid: 9"),
    (2.0, "    wildcards: corpus=rft_r1"),
    (21.0, "Finished jobid: 7 (Rule: train_arm)"),
    (21.0, "2 of 3 steps (67%) done"),
    (30.0, "Error in rule sample_candidates:"),
    (30.0, "    jobid: 9"),
]


@pytest.fixture
def run_dir(tmp_path):
    results = tmp_path / "results"
    bench = results / "bench"
    bench.mkdir(parents=True)
    (bench / "snakemake.log").write_text(
        "".join(f"{T0 + t:.3f}\t{line}\n" for t, line in SNAKEMAKE)
    )
    events = [
        {"job": "runs/S1/final", "event": "mark", "phase": "imports", "t": T0 + 3.2, **START},
        {"job": "runs/S1/final", "event": "mark", "phase": "model", "t": T0 + 5.0, **START},
        {"job": "runs/S1/final", "event": "loaded", "t": T0 + 6.0, "process_start": T0 + 1.2},
        {"job": "runs/S1/final", "event": "trained", "t": T0 + 19.25, "process_start": T0 + 1.2},
        {"job": "runs/S1/final", "event": "weights_saved", "t": T0 + 19.5, **START},
        {"job": "runs/S1/final", "event": "committed", "t": T0 + 19.875, **START},
        {
            "job": "runs/S1/final",
            "event": "end",
            "t": T0 + 20.0,
            "process_start": T0 + 1.2,
            "tokens": 120_000,
            "seconds": 12.0,
        },
        {
            "job": "candidates/rft_r1/samples.jsonl",
            "event": "loaded",
            "t": T0 + 10.0,
            "process_start": T0 + 2.1,
        },
    ]
    (bench / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    # busy 100 % from 8 s to 20 s, idle before
    (bench / "gpu_util.tsv").write_text(
        "".join(f"{T0 + i / 2:.3f}\t{100 if 16 <= i <= 40 else 0}\t1000\n" for i in range(0, 70))
    )
    (bench / "run.json").write_text(
        json.dumps(
            {
                "snakemake_start": T0,
                "snakemake_end": T0 + 31.0,
                "returncode": 1,
                "deadline_hit": False,
            }
        )
    )
    run = results / "runs/S1"
    (run / "final").mkdir(parents=True)
    steps = [
        {"step": 1, "elapsed_s": 4.0, "tokens_seen": 20_000, "micro_batches": [[200, 101]]},
        {"step": 2, "elapsed_s": 4.25, "tokens_seen": 70_000, "micro_batches": [[500, 100]]},
        {"step": 3, "elapsed_s": 4.5, "tokens_seen": 120_000, "micro_batches": [[512, 98]]},
    ]
    (run / "final/metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (run / "final/training_evidence.json").write_text(
        json.dumps({"tokens_seen": 120_000, "wall_time_s": 4.5})
    )
    log = results / "logs/candidates/rft_r1.sample.log"
    log.parent.mkdir(parents=True)
    log.write_text(
        "arenaflow: loaded\n"
        "sample: 128/2000 prompts x4 | 10000 tok | 1000 tok/s | 10.0s | ETA 146s\n"
        "sample: 256/2000 prompts x4 | 30000 tok | 1500 tok/s | 12.0s | ETA 82s\n"
    )
    return results


def test_report_times_jobs_startup_work_and_gpu_busy(run_dir):
    rep = lg.report(run_dir, {})
    jobs = {j["rule"]: j for j in rep["jobs"]}
    assert [j["rule"] for j in rep["jobs"]] == ["build_pool", "train_arm", "sample_candidates"]
    assert jobs["build_pool"]["wall_s"] == 1.0 and "startup_s" not in jobs["build_pool"]
    t = jobs["train_arm"]
    assert (
        t["wall_s"] == 20.0
        and t["launch_s"] == pytest.approx(0.2)
        and t["startup_s"] == pytest.approx(4.8)
    )
    assert t["work_s"] == pytest.approx(14.0) and t["tokens_per_s"] == 10_000
    # start-up by phase: to the first mark, mark to mark, the last mark to the model loaded
    assert t["startup_phases"] == pytest.approx({"imports": 2.0, "model": 1.8, "rest": 1.0})
    assert rep["stages"]["train_arm"]["startup_phases_median"] == t["startup_phases"]
    assert "start-up of train_arm (median s): imports 2.0, model 1.8, rest 1.0" in lg.table(rep)
    # samples every 0.5 s in (6, 20]: 28, of which 25 busy (8.0 .. 20.0 s)
    assert t["gpu_busy_after_load"] == pytest.approx(25 / 28) and t["gpu_samples"] == 28
    assert t["first_unit_s"] == 4.0 and t["steady_tokens_per_s"] == 200_000  # after the first step
    assert (
        t["loop_tokens_per_s"] == pytest.approx(120_000 / 4.5, rel=1e-3)
        and t["tokens_per_step"] == 40_000
    )
    assert t["micro_batches"] == [[[200, 101]], [[500, 100]], [[512, 98]]]  # for --shapes
    assert t["step_s_median"] == 0.25 and t["exit_s"] == pytest.approx(
        1.0
    )  # Finished 1 s after its end event
    assert t["gpu_busy_steady"] == 1.0  # samples in (10, 20]: after the first step, all busy
    # from the last step's end to the job's end event: the save
    assert t["save_s"] == 0.75 and rep["stages"]["train_arm"]["save_s_median"] == 0.75
    assert t["save_phases"] == {"weights": 0.25, "evidence_manifest": 0.375, "rest": 0.125}
    assert rep["stages"]["train_arm"]["save_phases_median"] == t["save_phases"]
    s = jobs["sample_candidates"]
    assert s["failed"] and s["end"] is None and s["batches"] == 2
    assert s["first_unit_s"] == 10.0 and s["steady_tokens_per_s"] == pytest.approx(10_000)
    assert rep["summary"]["jobs_done"] == 2 and rep["summary"]["jobs_total"] == 3
    assert rep["summary"]["dag_wall_s"] == 31.0 and not rep["summary"]["complete"]
    assert rep["stages"]["train_arm"]["tokens_per_s"] == 10_000
    tg = rep["targets"]
    assert tg["measured"] and not tg["dag_wall"]["met"]  # incomplete
    assert tg["train_tokens_per_s"]["min_steady"] == 200_000 and tg["train_tokens_per_s"]["met"]
    assert tg["train_tokens_per_s"]["shared"] == {}  # the sampling never ended: no overlap
    assert not tg["gpu_busy_after_load"][
        "met"
    ]  # incomplete: the failed job's work was never measured
    assert "whole DAG: 31.0 s wall" in lg.table(rep)


def test_a_jobs_own_process_samples_set_its_busy_fraction_not_its_neighbours(run_dir):
    """S1 (pid 41) works from 6 s to 20 s; the driver reports a process every 0.2 s for the
    periods it ran in. S1 ran at 50 % SM for 7 s of its 14 (samples from 6.2 s to 13.0 s) while
    a neighbour (pid 99) kept the device busy all the time: the device says ~90 %, S1's own
    samples 7 s x 50 % / 14 s = 25 %, and that is what the target judges."""
    bench = run_dir / "bench"
    events = [json.loads(x) for x in (bench / "events.jsonl").read_text().splitlines()]
    for e in events:
        e["pid"] = 41 if e["job"] == "runs/S1/final" else 42
    (bench / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    own = [(T0 + 6.0 + 0.2 * i, 41, 50) for i in range(1, 36)]  # 35 periods: 7 s
    other = [(T0 + 0.2 * i, 99, 100) for i in range(1, 150)]
    (bench / "gpu_proc_util.tsv").write_text(
        "".join(f"{t:.6f}\t{pid}\t{sm}\n" for t, pid, sm in sorted(own + other))
    )
    rep = lg.report(run_dir, {})
    t = next(j for j in rep["jobs"] if j["rule"] == "train_arm")
    assert rep["summary"]["process_sample_period_s"] == pytest.approx(0.2)
    assert t["gpu_own_samples"] == 35
    assert t["gpu_busy_own"] == pytest.approx(35 * 0.5 * 0.2 / 14.0)
    assert t["gpu_busy_after_load"] > 0.8  # the device's: the neighbour's work counts
    assert t["overlap"] == 0  # pid 99 is no job of the DAG's: S1 worked alone
    below = rep["targets"]["gpu_busy_after_load"]["below"]
    assert {
        "rule": "train_arm",
        "wildcards": "arm=S1",
        "busy": t["gpu_busy_own"],
        "measure": "own",
    } in below
    assert "own process busy (median / min)" in lg.table(rep)


def test_a_job_that_shared_the_gpu_is_judged_by_the_device():
    alone = {"gpu_busy_after_load": 0.9, "gpu_busy_own": 0.3, "overlap": 0.0}
    shared = {**alone, "overlap": 0.6}
    unreported = {"gpu_busy_after_load": 0.9, "overlap": 0.0}
    assert lg.job_busy(alone) == (0.3, "own")
    assert lg.job_busy(shared) == (0.9, "device")
    assert lg.job_busy(unreported) == (0.9, "device")


def test_a_suites_readout_rule_is_the_readout_stage_with_its_suite_as_a_wildcard():
    assert lg.stage("readout_math", "rarm=B3") == ("readout", "suite=math, rarm=B3")
    assert lg.stage("train_arm", "arm=B3") == ("train_arm", "arm=B3")


def test_a_readouts_files_count_on_from_the_file_before(tmp_path):
    """A readout decodes its regimes x replicates in one process, each file's progress from
    zero (H200 run 15's dose-a2 log, shortened): chained, the tokens reach the job's own total
    (its last line) and the steady rate is positive; read file by file it came out -8,493."""
    line = "readout math/dose-a2/{}: 600/600 prompts x1 | {} tok | {} tok/s | {}s | ETA 0s\n"
    log = tmp_path / "dose-a2.log"
    log.write_text(
        "arenaflow: readouts/math/dose-a2/greedy.r0.parquet: model loaded 4.3s after the process"
        " started (imports 0.2s, verify 0.1s, model 3.5s, rest 0.5s)\n"
        + line.format("greedy.r0", 40166, 5450, 7.4)
        + "math/dose-a2: accuracy 0.0067 on 600 items -> readouts/math/dose-a2/greedy.r0.parquet\n"
        + line.format("served.r0", 16446, 2182, 7.5)
        + line.format("served.r1", 18164, 4111, 4.4)
        + line.format("served.r2", 18785, 11682, 1.6)
        + "arenaflow: readouts/math/dose-a2/greedy.r0.parquet: 93561 tokens in 21.9s, 4273 tok/s\n"
    )
    prog = lg.progress_lines(log)
    assert [p["tokens"] for p in prog] == [40166, 56612, 74776, 93561]
    assert [p["elapsed"] for p in prog] == pytest.approx([7.4, 14.9, 19.3, 20.9])
    first, steady = lg.first_and_steady([(p["elapsed"], p["tokens"]) for p in prog])
    assert first == pytest.approx(7.4)
    assert steady == pytest.approx((93561 - 40166) / (20.9 - 7.4))


def test_arms_that_trained_beside_other_gpu_jobs_are_named(tmp_path):
    """H200 run 15's files: the chain S1 -> R220 -> R2d trains alone (each waits on a sampling),
    while B1..B4 train two at a time beside the readouts; the target names those four."""
    with tarfile.open(REPO / "benchmarks/results/lineage_gpu-2026-12-02-run15-files.tgz") as t:
        t.extractall(tmp_path, filter="data")
    tr = lg.report(tmp_path / "run15", {})["targets"]["train_tokens_per_s"]
    assert set(tr["shared"]) == {"arm=B1", "arm=B2", "arm=B3", "arm=B4"}
    assert all(0 < share <= 1 for share in tr["shared"].values())
    assert tr["min_steady"] == tr["per_arm_steady"]["arm=R2d"] and not tr["met"]


def test_jobclock_marks_start_up_phases_in_the_loaded_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv(jobclock.ENV, str(path))
    monkeypatch.setattr(jobclock, "_MARKS", [])
    jobclock.mark("runs/A/final", "imports")
    jobclock.mark("runs/A/final", "model")
    rec = jobclock.loaded("runs/A/final")
    phases = dict(jobclock.phases(rec["t"]))
    assert list(phases) == ["imports", "model", "rest"]
    assert sum(phases.values()) == pytest.approx(rec["t"] - jobclock.PROCESS_START)
    events = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(e["event"], e.get("phase")) for e in events] == [
        ("mark", "imports"),
        ("mark", "model"),
        ("loaded", None),
    ]
    assert re.search(
        r"model loaded [\d.]+s .*\(imports [\d.]+s, model [\d.]+s, rest", capsys.readouterr().err
    )


def test_critical_chain_walks_back_through_the_job_whose_end_started_the_next():
    jobs = [
        {"rule": "a", "wildcards": "", "start": 0.0, "end": 5.0, "wall_s": 5.0},
        {"rule": "b", "wildcards": "", "start": 0.0, "end": 2.0, "wall_s": 2.0},
        {
            "rule": "c",
            "wildcards": "",
            "start": 5.3,
            "end": 20.0,
            "wall_s": 14.7,
            "loaded": 9.0,
            "startup_s": 3.5,
            "work_s": 10.0,
            "exit_s": 1.0,
        },
        {"rule": "d", "wildcards": "x=1", "start": 20.1, "end": 22.0, "wall_s": 1.9},
        {"rule": "e", "wildcards": "", "start": 2.1, "end": 21.0, "wall_s": 18.9},
    ]
    chain = lg.critical_chain(jobs)
    assert [r["rule"] for r in chain] == ["a", "c", "d"]
    assert lg.chain_summary(chain) == {
        "jobs": ["a[]", "c[]", "d[x=1]"],
        "span_s": 22.0,
        "gpu_jobs": 1,
        "gpu_startup_s": 3.5,
        "gpu_work_s": 10.0,
        "gpu_exit_s": 1.0,
        "other_jobs_s": 6.9,
    }


def test_union_of_intervals():
    assert lg._union([(5.0, 10.0), (8.0, 9.0)]) == 5.0
    assert lg._union([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0
    assert lg._union([]) == 0.0


def test_no_gpu_samples_means_targets_not_measured(run_dir):
    (run_dir / "bench/gpu_util.tsv").write_text("")
    rep = lg.report(run_dir, {})
    assert rep["targets"] == {
        "measured": False,
        "why": "no GPU utilisation samples (not a GPU run)",
    }
    assert "targets: not measured" in lg.table(rep)


def test_jobclock_writes_events_and_a_log_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv(jobclock.ENV, str(path))
    jobclock.loaded("runs/A/final")
    jobclock.done("runs/A/final", tokens=100, seconds=2.0)
    events = lg.read_events(path)
    e = events["runs/A/final"]
    assert (
        e["process_start"] <= e["loaded"] <= e["end"] and e["tokens"] == 100 and e["seconds"] == 2.0
    )
    err = capsys.readouterr().err
    assert "runs/A/final: model loaded" in err and "100 tokens in 2.0s, 50 tok/s" in err
    monkeypatch.delenv(jobclock.ENV)
    jobclock.loaded("runs/B/final")  # no file named: the log line only
    assert "runs/B/final" not in lg.read_events(path)


def test_process_start_is_when_the_process_started():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; t = time.time(); from arenaflow import jobclock; "
            "print(t - jobclock.PROCESS_START)",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert 0.0 <= float(out.stdout) < 10.0


@pytest.mark.dag
def test_smoke_run_on_cpu(tmp_path):
    """The whole script on the tiny model, to the first comparison (every kind of GPU job, the
    fewest jobs): each GPU job reports its start-up and tokens."""
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/lineage_gpu.py",
            "--smoke",
            "--results",
            str(tmp_path / "r"),
            "--target",
            "compare/math/greedy/R220__S1.json",
            "--out",
            str(out),
            "--archive",
            str(tmp_path / "r.tgz"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rep = json.loads(out.read_text())
    assert (
        rep["summary"]["complete"] and rep["summary"]["jobs_done"] == rep["summary"]["jobs_total"]
    )
    gpu = [j for j in rep["jobs"] if j.get("gpu")]
    assert {j["rule"] for j in gpu} == {"sample_candidates", "train_arm", "readout"}
    assert all(j["startup_s"] > 0 and j["tokens"] > 0 for j in gpu)
    assert rep["targets"]["measured"] is False
    # The archive leaves out the data a rerun regenerates (pools, corpus and readout rows, the
    # bundle's tokenizer) and keeps what the report is read from: re-derived from the archive
    # alone, the report is the same.
    with tarfile.open(tmp_path / "r.tgz") as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "x", filter="data")
    top = {n.split("/")[1] for n in names if "/" in n}
    assert not [n for n in names if n.endswith((".parquet", ".npz", "rows.jsonl"))]
    assert not top & {"pools", "candidates"}
    assert any(n.startswith("r/logs/candidates/") for n in names)  # the sampling's progress
    again = tmp_path / "again.json"
    lg.main(["--report", str(tmp_path / "x/r"), "--out", str(again)])
    rep2 = json.loads(again.read_text())
    assert rep2["jobs"] == rep["jobs"] and rep2["targets"] == rep["targets"]
    assert rep2["summary"] == rep["summary"]


def test_trainings_cap_is_a_resource_of_its_own_that_snakemake_applies(tmp_path):
    """--trainings caps trainings at once apart from the GPU slots (a resource local_trainings);
    Snakemake takes the command and gives train_arm the resource."""
    args = lg.argparse.Namespace(
        cores=2, gpu_slots=8, train_slots=2, trainings=1, resume=False, target=["runs/S1/final"]
    )
    cmd = lg.snakemake_command(args, tmp_path / "r", [REPO / "config/config.yaml"])
    dry = subprocess.run(
        [*cmd[: cmd.index("--")], "-n", "--", *args.target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    train = dry.stdout[dry.stdout.index("rule train_arm:") :]
    assert "local_gpus=2" in train and "local_trainings=1" in train
    args.trainings = None
    assert not [a for a in lg.snakemake_command(args, tmp_path, []) if "local_trainings" in a]


def test_resume_needs_an_earlier_leg_and_takes_its_config_files(tmp_path):
    args = lg.argparse.Namespace(resume=str(tmp_path), results=None)
    with pytest.raises(SystemExit, match="no earlier leg's bench/run.json"):
        lg.start_leg(args)
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench/run.json").write_text(
        json.dumps({"configfiles": ["config/seeds/002.yaml", "/abs/over.yaml"]})
    )
    for leg in (2, 3):
        results, bench, configs = lg.start_leg(args)
        assert bench == tmp_path / f"bench-{leg}" and bench.is_dir()
        assert configs == [REPO / "config/seeds/002.yaml", Path("/abs/over.yaml")]
    assert [p.name for p in lg.leg_dirs(tmp_path)] == ["bench", "bench-2", "bench-3"]
    fresh = lg.argparse.Namespace(resume=None, results=str(tmp_path))
    with pytest.raises(SystemExit, match="not empty.*--resume"):
        lg.start_leg(fresh)


@pytest.mark.dag
def test_a_run_stopped_at_its_deadline_finishes_with_resume(tmp_path):
    """Leg 1 stops at --deadline (counted from the script's start) with the DAG unfinished;
    --resume runs the rest in the same results directory as leg 2, reported on its own."""
    results, target = tmp_path / "r", "compare/math/greedy/R220__S1.json"

    def leg(*extra):
        out = tmp_path / f"leg{len(list(tmp_path.glob('leg*.json'))) + 1}.json"
        cmd = [sys.executable, "benchmarks/lineage_gpu.py", "--smoke", "--out", str(out), *extra]
        proc = subprocess.run(
            [*cmd, "--target", target], cwd=REPO, capture_output=True, text=True, timeout=1800
        )
        return proc, json.loads(out.read_text())

    proc1, rep1 = leg("--results", str(results), "--deadline", "18")
    assert proc1.returncode == 1 and rep1["summary"]["deadline_hit"]
    assert rep1["summary"]["jobs_done"] < rep1["summary"]["jobs_total"]
    assert not (results / target).exists()
    locks = results / ".snakemake/locks"
    locks.mkdir(parents=True, exist_ok=True)  # as a leg killed with SIGKILL leaves it:
    (locks / "0.output.lock").write_text(target + "\n")  # Snakemake's own format, its own path
    proc2, rep2 = leg("--resume", str(results), "--archive", str(tmp_path / "r.tgz"))
    assert proc2.returncode == 0, proc2.stdout[-4000:] + proc2.stderr[-4000:]
    assert rep2["summary"]["complete"] and (results / target).exists()
    with tarfile.open(tmp_path / "r.tgz") as tar:
        names = tar.getnames()
    assert f"r/{target}" in names and "r/bench-2/run.json" in names
    assert any(n.startswith("r/runs/S1/final/") for n in names)  # evidence, manifest
    assert not [n for n in names if n.endswith(".safetensors") or n.startswith("r/candidates/")]
    run2 = json.loads((results / "bench-2/run.json").read_text())
    assert "--rerun-incomplete" in run2["command"] and run2["leg"] == "bench-2"
    legs, s1, s2 = rep2["all_legs"], rep1["summary"], rep2["summary"]
    assert legs["legs"] == ["bench", "bench-2"] and legs["complete"]
    assert legs["dag_wall_s"] == [s1["dag_wall_s"], s2["dag_wall_s"]]
    assert legs["jobs_done_sum"] == legs["jobs_total"] == s1["jobs_done"] + s2["jobs_total"]
    assert f"all 2 legs: {legs['dag_wall_s_sum']:,.1f} s of DAG wall" in proc2.stdout
    assert rep1["all_legs"] is None


def test_jobs_are_told_the_commit_a_copy_without_its_history_runs(tmp_path, monkeypatch):
    """--commit (the GPU machine's copy carries another commit's .git) reaches every job, whose
    manifests record it beside git's own answer (manifest.code_version)."""
    monkeypatch.delenv("ARENAFLOW_SOURCE_COMMIT", raising=False)
    args = argparse.Namespace(shared_cache=False, env=[], commit="0123abc")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()  # each may get its own python wrapper
    assert lg.job_env(args, tmp_path / "a")["ARENAFLOW_SOURCE_COMMIT"] == "0123abc"
    args.commit = None
    assert "ARENAFLOW_SOURCE_COMMIT" not in lg.job_env(args, tmp_path / "b")
