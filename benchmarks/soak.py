"""Soak: the embedded default's continual rounds run by Snakemake twice, uninterrupted and under
random faults, and the two runs' results compared.

    nice -n 10 python benchmarks/soak.py --rounds 6 --faults 6 --seed 1 --root /tmp/soak \\
        --out benchmarks/results/soak-2026-12-07.json      # full size, by hand (as root)
    python benchmarks/soak.py --rounds 1 --faults 2 --seed 3 --shared-prefix --pool-n 12 \\
        --tmpfs-size 64m --disk-full-hold 30 --root /tmp/soak-ci     # CI's (tests/e2e, dag tier)
    python benchmarks/soak.py --rounds 1 --faults 2 --seed 3 --tmpfs-size 512m \\
        --disk-full-hold 30 --root /tmp/soak-small                   # small (marker soak, by hand)

Times, on the 2-core x86 development VM shared with other sessions (load average 7-14, 2 at the
end: walls there are several times an idle machine's; the CPU seconds, user + system of
Snakemake and every job, are the runs' own). The CI setting, as its test runs it
(`nice -n 10 python -m pytest -q -m dag tests/e2e/test_soak_runs.py`, raw
benchmarks/results/soak-ci-2026-12-07-b.json): 17.9 min wall, prefix 650 s (37 jobs, CPU 226),
reference 240 s (20 jobs, CPU 125), faulty run 185 s over 4 attempts (CPU 133), all 7 checks
passed; 484 CPU s in all is at least 4.0 min on an idle 2 cores. A first run, before B3f
joined the prefix (raw ...-a.json): 21.6 min wall, 530 CPU s (each run had 29 jobs left, the
lineage's readouts among them). The small setting: ~15 min idle. The full one has not run yet.

Both runs are the command a user runs (`python -m snakemake --cores 2 rounds/rN.json bundles/...
--configfile ... --config results_dir=...`) on the smallest DAG (tests/e2e/mini.yaml) with
`--rounds` continual rounds after r3 (stop rule off: every round runs) and a bundle of the last
round's nominee. With --shared-prefix (the CI setting) the DAG up to r3's nomination and its
bundle B3f is built once, uninterrupted, and both runs start from a copy of it (Snakemake's
records and mtimes with it): only the continual rounds and their bundle are left to compute, so
every fault lands there, and a prefix output written again fails the recompute check. The
faulty run's results live on a tmpfs the harness mounts (root only; without it the disk-full
fault is skipped, the reason printed and recorded). An injector, at moments drawn from a seeded
RNG, once a job runs, (i) SIGKILLs one running job's python process (a job mid-write), (ii)
SIGTERMs Snakemake itself, (iii) once fills the results disk; after each fault the same command
is run again with --rerun-incomplete, as a person or a cluster's requeue would (a full disk is
emptied first).

Checks (exit 1 if one fails): every planned fault was injected and the run recovered from each
(the final attempt exits 0, no attempt failed without a fault); each landed (jobs ran; a full
disk failed its attempt); no output that was complete after an attempt (present, not marked
incomplete by Snakemake, not owed by a job Snakemake would run again: a job that wrote one of its
outputs and failed owes it still), or copied from the shared prefix, was rewritten later (mtime and
sha256, output by output); the nominations (their sealed digests), the corpora's and the
bundles' sha256 manifests (their content digests) equal the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from arenaflow import manifest  # noqa: E402
from arenaflow.schema import round_ids  # noqa: E402

CONFIGS = ("config/config.yaml", "tests/e2e/config.yaml", "tests/e2e/mini.yaml")
AFTER = "r3"  # the round the embedded default's continual template follows
KINDS = ("kill_job", "term_snakemake", "disk_full")
# The smallest DAG up to AFTER's nomination and its bundle B3f (whose card cites the lineage's
# readouts and comparisons, base to R2d: the continual bundle's card cites them too): with
# --shared-prefix built once, uninterrupted, and copied as both runs' starting state
PREFIX = [f"nominations/{AFTER}.json", "bundles/B3f"]
# Bundles of AFTER's arms: targets of both runs unless they share the prefix (B3f is in it,
# Bdose would be a job on no fault's path)
PREFIX_BUNDLES = ["bundles/B3f", "bundles/Bdose"]


# -- the workflow and its command ---------------------------------------------------------------


def last_round(rounds: int) -> str:
    def error(msg):
        return SystemExit(msg)

    return round_ids(AFTER, rounds, "--rounds", error)[-1]


def overlay(rounds: int, pool_n: int) -> dict:
    """The config merged over CONFIGS: `rounds` continual rounds that all run, and a bundle of
    the last round's nominee."""
    return {
        "continual": {
            "rounds": rounds,
            "stop": {"after_kept_rounds": rounds},
            "pool": {"n": pool_n, "seed": 40, "split": "train", "categories": {"add": 1, "sub": 1}},
        },
        "bundles": {
            "Bsoak": {
                "round": last_round(rounds),
                "chat_template": "chatml",
                "serving": {"max_input_tokens": 256, "max_new_tokens": 48},
                "reload_prompts": ["Ann has 23 apples and gets 15 more. How many apples now?"],
            }
        },
    }


def targets(rounds: int, shared_prefix: bool) -> list[str]:
    bundles = [] if shared_prefix else PREFIX_BUNDLES
    return [f"rounds/{last_round(rounds)}.json", *bundles, "bundles/Bsoak"]


def command(goals: list[str], results: Path, arms: Path, extra: Path, rerun: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        *goals,
        "--cores",
        "2",
        *(["--rerun-incomplete"] if rerun else []),
        "--configfile",
        *[str(REPO / c) for c in CONFIGS],
        str(extra),
        "--config",
        f"results_dir={results}",
        f"arms_dir={arms}",
    ]


# -- outputs: what was complete, what changed ---------------------------------------------------


def _b64_names(folder: Path) -> dict[str, Path]:
    """Snakemake's per-output records (.snakemake/metadata, .snakemake/incomplete) are named by
    the output's path, urlsafe-base64, split into '@'-prefixed folders where longer than a file
    name."""
    if not folder.is_dir():
        return {}
    out = {}
    for p in folder.rglob("*"):
        if p.is_file():
            name = "".join(s.removeprefix("@") for s in p.relative_to(folder).parts)
            out[base64.urlsafe_b64decode(name).decode()] = p
    return out


def pending(cmd: list[str]) -> frozenset[str]:
    """The outputs Snakemake would (re)make now for `cmd`'s targets (its --summary's plan is
    not "no update"): a file of a job that wrote some of its outputs and then failed is still
    owed by that job, however whole the file looks, and Snakemake may write it again."""
    proc = subprocess.run(
        [*cmd, "--summary", "--nolock"], cwd=REPO, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"snakemake --summary failed:\n{proc.stderr[-3000:]}")
    rows = (line.split("\t") for line in proc.stdout.splitlines())
    return frozenset(
        r[0] for r in rows if len(r) == 6 and r[0] != "output_file" and r[5] != "no update"
    )


def snapshot(results: Path, owed: frozenset[str] = frozenset()) -> dict[str, list]:
    """{relpath: [the job's end time, mtime_ns, sha256]} of every file of every complete output:
    one Snakemake recorded as made (metadata), did not mark incomplete (a job started, not
    finished) and does not plan to make again (`owed`, from pending()). Files no rule declares
    (the registry, the journal, logs) are not outputs."""
    meta = _b64_names(results / ".snakemake/metadata")
    skip = set(_b64_names(results / ".snakemake/incomplete")) | owed
    out = {}
    for rel, record in sorted(meta.items()):
        path = results / rel
        if rel in skip or not path.exists():
            continue
        try:
            end = json.loads(record.read_text()).get("endtime")
        except (OSError, ValueError):  # a record being written
            continue
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for f in files:
            hidden = any(s.startswith(".") for s in f.relative_to(path).parts)
            if f.is_file() and not hidden:  # .snakemake_timestamp, parts, atomic temp names
                out[f.relative_to(results).as_posix()] = [
                    end,
                    f.stat().st_mtime_ns,
                    manifest.sha256_file(f),
                ]
    return out


def rewritten(before: dict[str, list], results: Path) -> list[dict]:
    """Files complete in `before` that are now gone or were written again (a job run again
    records a new end time)."""
    now = snapshot(results)
    return [
        {"path": rel, "was": old, "now": now.get(rel)}
        for rel, old in sorted(before.items())
        if now.get(rel) != old
    ]


# What two uninterrupted runs write differently: times (a registration's, a readout's, a
# training's wall, a merge's phases), the job's id, the code's identity, and the hashes of
# files that carry them
VOLATILE = {
    "digest",
    "inputs",
    "sha256",
    "code",
    "registered_utc",
    "created_utc",
    "judged_utc",
    "wall_time_s",
    "job_id",
    "gpu_hours",
    "manifest_sha256",
    "manifest_digest",
    "phases_s",
}
# ... and where a record quotes such a hash in its text (a bundle's checks: "sealed (digest ...)")
QUOTED_HASH = re.compile(r"\b[0-9a-f]{16,64}\b")


def stable(record):
    """A JSON record without what two uninterrupted runs would write differently."""
    if isinstance(record, dict):
        return {k: stable(v) for k, v in record.items() if k not in VOLATILE}
    if isinstance(record, list):
        return [stable(v) for v in record]
    if isinstance(record, str):
        return QUOTED_HASH.sub("<sha256>", record)
    return record


# A bundle's card (README.md) quotes its nomination's digest and registration time, the commit
# it was built at and each training's job id (a local one: host and pid)
CARD_VOLATILE = re.compile(
    r"\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d\d:\d\d|Z)?|\b[0-9a-f]{12,64}\b|\blocal-[\w.-]+-\d+\b"
)


def file_record(path: Path) -> str:
    """A JSON file's stable content's sha256, a card's without times and sha256s, any other
    file's bytes' sha256."""
    if path.suffix == ".json":
        text = json.dumps(stable(json.loads(path.read_text())), sort_keys=True)
        return manifest.sha256_text(text)
    if path.suffix == ".md":
        return manifest.sha256_text(CARD_VOLATILE.sub("<volatile>", path.read_text()))
    return manifest.sha256_file(path)


def final_records(results: Path) -> dict[str, str]:
    """What must equal the uninterrupted run's: each nomination (every clause's number and
    verdict, the arm promoted), every file each corpus's and bundle's sha256 manifest lists
    (JSON files without their times, VOLATILE)."""
    rec = {}
    for p in sorted((results / "nominations").glob("r*.json")):
        rec[p.relative_to(results).as_posix()] = file_record(p)
    for kind in ("corpora", "bundles"):
        for m in sorted((results / kind).glob(f"*/{manifest.MANIFEST}")):
            for rel in json.loads(m.read_text())["files"]:
                rec[(m.parent / rel).relative_to(results).as_posix()] = file_record(m.parent / rel)
    return rec


# -- faults -------------------------------------------------------------------------------------


def job_processes(snake: psutil.Process) -> list[psutil.Process]:
    """The python processes of running jobs (`python -m arenaflow.<stage> ...`) under Snakemake."""
    found = []
    for p in snake.children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if len(cmd) > 2 and cmd[1] == "-m" and cmd[2].startswith("arenaflow."):
            found.append(p)
    return sorted(found, key=lambda p: p.pid)


def leftovers(sid: int) -> list[psutil.Process]:
    """Processes still in Snakemake's session (a job that outlived its Snakemake)."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


def fill(mount: Path) -> tuple[Path, int]:
    """Write zeros under `mount` until the file system says it is full."""
    path, chunk, n = mount / "soak-filler.bin", b"\0" * (1 << 20), 0
    with open(path, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
                n += len(chunk)
        except OSError:
            pass
    return path, n


def mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at `where`; None, or why not."""
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return f"mount -t tmpfs failed ({proc.returncode}): {proc.stderr.strip()}"
    return None


def plan(rng: random.Random, faults: int, disk: bool) -> list[str]:
    """`faults` job kills and Snakemake SIGTERMs (at least one of each from 2), the disk-full
    fault once at a random place among them."""
    kinds = [KINDS[i % 2] for i in range(faults)]
    rng.shuffle(kinds)
    if disk:
        kinds.insert(rng.randrange(len(kinds) + 1), "disk_full")
    return kinds


# -- one attempt --------------------------------------------------------------------------------


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children and theirs, once reaped: one
    attempt's Snakemake and every job it ran, on a machine where other work runs too."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


class Attempt:
    """One `snakemake` invocation, and the fault (if any) injected into it."""

    def __init__(self, cmd: list[str], log: Path):
        self.log, self.cmd = log, cmd
        self.out = open(log, "w")
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.snake = psutil.Process(self.proc.pid)
        self.t0, self.cpu0 = time.monotonic(), children_cpu()

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def finish(self, timeout: float) -> dict:
        """Wait for Snakemake, then for any job it left behind (killed after `timeout`)."""
        rc = self.wait(timeout)
        if rc is None:
            self.proc.kill()
            rc = self.proc.wait()
        stray = [p for p in leftovers(self.proc.pid) if p.pid != self.proc.pid]
        _, alive = psutil.wait_procs(stray, timeout=30)
        for p in alive:
            p.kill()
        self.out.close()
        return {
            "rc": rc,
            "wall_s": round(time.monotonic() - self.t0, 1),
            "cpu_s": round(children_cpu() - self.cpu0, 1),
            "log": self.log.name,
            "strays": len(stray),
            "strays_killed": len(alive),
        }


def running_jobs(att: Attempt) -> list[psutil.Process]:
    """The attempt's running jobs, once there is one: a fault lands in a job, not in Snakemake's
    DAG building or between jobs; [] if the attempt ended first."""
    while att.running():
        jobs = job_processes(att.snake)
        if jobs:
            return jobs
        time.sleep(0.2)
    return []


def inject(kind: str, att: Attempt, rng: random.Random, mount: Path, hold: float) -> dict | None:
    """Inject `kind` into the running attempt while a job runs; None if it ended first."""
    jobs = running_jobs(att)
    if not jobs:
        return None
    try:
        running = [" ".join(p.cmdline()[2:4]) for p in jobs]
    except psutil.Error:  # a job ended meanwhile: wait for the next
        return inject(kind, att, rng, mount, hold)
    if kind == "kill_job":
        victim = rng.choice(jobs)
        try:
            what = " ".join(victim.cmdline()[:4])
            victim.send_signal(signal.SIGKILL)
        except psutil.Error:
            return inject(kind, att, rng, mount, hold)
        return {"kind": kind, "pid": victim.pid, "process": what, "jobs_running": running}
    if kind == "term_snakemake":
        att.proc.send_signal(signal.SIGTERM)
        return {"kind": kind, "pid": att.proc.pid, "jobs_running": running}
    filler, n = fill(mount)
    rc = att.wait(hold)
    filler.unlink()  # freed before any rerun, as a person would
    return {
        "kind": kind,
        "filled_bytes": n,
        "jobs_running": running,
        "attempt_failed_while_full": rc is not None,
    }


# -- the two runs -------------------------------------------------------------------------------


def shared_prefix(args, root: Path, extra: Path, arms: Path) -> dict:
    """PREFIX built once, uninterrupted, in ROOT/prefix: both runs start from a copy of it."""
    results = root / "prefix"
    shutil.rmtree(results, ignore_errors=True)
    att = Attempt(command(PREFIX, results, arms, extra, False), root / "prefix.log")
    res = att.finish(args.attempt_timeout)
    if res["rc"] != 0:
        raise SystemExit(f"the shared prefix's run failed (rc {res['rc']}): see {att.log}")
    return {"results": str(results), "targets": PREFIX, **res}


def seed(prefix: dict | None, results: Path) -> None:
    """Start `results` as a copy of the shared prefix, Snakemake's records with it (copy2 keeps
    the mtimes: Snakemake sees every output complete and up to date), or empty without one."""
    shutil.rmtree(results, ignore_errors=True)
    if prefix:
        shutil.copytree(prefix["results"], results, symlinks=True)


def uninterrupted(args, root: Path, extra: Path, arms: Path, prefix: dict | None) -> dict:
    results = root / "reference"
    if args.reference:
        return {"results": str(args.reference), "reused": True}
    seed(prefix, results)
    start = snapshot(results)
    cmd = command(targets(args.rounds, bool(prefix)), results, arms, extra, False)
    att = Attempt(cmd, root / "reference.log")
    res = att.finish(args.attempt_timeout)
    if res["rc"] != 0:
        raise SystemExit(f"the uninterrupted run failed (rc {res['rc']}): see {att.log}")
    return {"results": str(results), **res, "recomputed_complete": rewritten(start, results)}


def faulty(args, root: Path, extra: Path, arms: Path, ref_wall: float, prefix: dict | None):
    rng = random.Random(args.seed)
    mount = root / "faulty"
    if mount.is_mount():
        subprocess.run(["umount", str(mount)], check=True)
    shutil.rmtree(mount, ignore_errors=True)
    why = None if args.no_disk_full else mount_tmpfs(mount, args.tmpfs_size)
    if args.no_disk_full:
        why = "--no-disk-full"
    if why:
        print(f"disk-full fault skipped: {why}", flush=True)
    results = mount / "results"
    todo = plan(rng, args.faults, why is None)
    attempts, injected = [], []
    try:
        seed(prefix, results)
        goals = targets(args.rounds, bool(prefix))
        owed = command(goals, results, arms, extra, True)  # what a rerun asks Snakemake
        complete = [snapshot(results, pending(owed))]  # the shared prefix: complete at start
        while len(attempts) < len(todo) + args.extra_attempts + 1:
            n = len(attempts)
            cmd = command(goals, results, arms, extra, n > 0)
            att = Attempt(cmd, root / f"faulty-{n}.log")
            fault = None
            if len(injected) < len(todo):
                delay = rng.uniform(0.1, 1.0) * ref_wall / (len(todo) + 1)
                if att.wait(delay) is None:
                    fault = inject(todo[len(injected)], att, rng, mount, args.disk_full_hold)
                if fault:
                    fault.update(attempt=n, after_s=round(time.monotonic() - att.t0, 1))
                    injected.append(fault)
                    print(f"attempt {n}: {fault['kind']} at {fault['after_s']} s", flush=True)
            res = att.finish(args.attempt_timeout)
            if fault:
                fault["attempt_rc"] = res["rc"]
            attempts.append({**res, "fault": fault["kind"] if fault else None})
            complete.append(snapshot(results, pending(owed)))
            print(f"attempt {n}: rc {res['rc']} in {res['wall_s']} s", flush=True)
            if res["rc"] == 0 and len(injected) == len(todo):
                break
        changed = []
        # complete[0] is the starting state, complete[i + 1] what attempt i left complete
        for i, snap in enumerate(complete[:-1]):
            when = i - 1 if i else "start"
            changed += [{**c, "complete_after_attempt": when} for c in rewritten(snap, results)]
        return {
            "results": str(results),
            "disk_full_skipped": why,
            "planned": todo,
            "faults": injected,
            "attempts": attempts,
            "recomputed_complete": _dedup(changed),
            "complete_after_each_attempt": complete[1:],
            "complete_at_start": complete[0],
            "records": final_records(results),
        }
    finally:
        if args.keep_mount:
            print(f"tmpfs left mounted at {mount}", flush=True)
        elif why is None:
            _copy_out(results, root / "faulty-results")
            subprocess.run(["umount", "-l", str(mount)], check=False)


def _dedup(changed: list[dict]) -> list[dict]:
    seen, out = set(), []
    for c in changed:
        if c["path"] not in seen:
            seen.add(c["path"])
            out.append(c)
    return out


def _copy_out(results: Path, to: Path) -> None:
    """The tmpfs goes with its mount: what it held is kept on disk for a look afterwards."""
    shutil.rmtree(to, ignore_errors=True)
    if results.is_dir():
        shutil.copytree(results, to, symlinks=True)


# -- the report ---------------------------------------------------------------------------------


def landed(fault: dict) -> bool:
    """A job was killed; a SIGTERM or a full disk came while jobs ran, and a full disk failed
    its attempt (something wrote to it): while full, or after, Snakemake waiting for the jobs
    still running before it exits."""
    if fault["kind"] == "kill_job":
        return bool(fault["process"])
    failed = fault.get("attempt_failed_while_full") or fault.get("attempt_rc") not in (0, None)
    full = fault["kind"] != "disk_full" or failed
    return bool(fault.get("jobs_running")) and full


def checks(report: dict) -> dict[str, bool]:
    f = report["faulty"]
    ref = report["reference"]["records"]
    atts = f["attempts"]
    return {
        "every planned fault injected": len(f["faults"]) == len(f["planned"]),
        "final attempt exits 0": atts[-1]["rc"] == 0,
        "no attempt failed without a fault": all(a["rc"] == 0 or a["fault"] for a in atts),
        "no job outlived its Snakemake": all(a["strays"] == 0 for a in atts),
        "every fault landed while a job ran": all(landed(x) for x in f["faults"]),
        "0 complete outputs recomputed": not f["recomputed_complete"]
        and not report["reference"].get("recomputed_complete"),
        "nominations, corpora, bundles identical": f["records"] == ref and bool(ref),
    }


def _times(runs: list[dict], missing: str) -> str:
    if not all("wall_s" in r for r in runs):
        return missing
    wall = f"{sum(r['wall_s'] for r in runs):.1f}"
    if not all("cpu_s" in r for r in runs):  # a report from before CPU was recorded
        return wall
    return f"{wall}, {sum(r['cpu_s'] for r in runs):.1f}"


def summary(report: dict) -> str:
    f = report["faulty"]
    kinds = {k: sum(x["kind"] == k for x in f["faults"]) for k in KINDS}
    recovered = sum(1 for a in f["attempts"][1:] if a["rc"] == 0 or a["fault"])
    diff = sorted(
        k
        for k in set(f["records"]) | set(report["reference"]["records"])
        if f["records"].get(k) != report["reference"]["records"].get(k)
    )
    rows = [
        ("rounds", report["rounds"]),
        ("shared prefix: wall s, CPU s", _times([report.get("prefix") or {}], "none")),
        ("reference: wall s, CPU s", _times([report["reference"]], "reused")),
        ("faulty, all attempts: wall s, CPU s", _times(f["attempts"], "-")),
        ("attempts", len(f["attempts"])),
        *[(f"faults: {k}", n) for k, n in kinds.items()],
        ("disk-full skipped", f["disk_full_skipped"] or "no"),
        ("recoveries (reruns that went on)", recovered),
        ("complete outputs recomputed", len(f["recomputed_complete"])),
        ("records compared", len(report["reference"]["records"])),
        ("records different", ", ".join(diff) or 0),
        *[(f"check: {k}", "pass" if ok else "FAIL") for k, ok in report["checks"].items()],
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6, help="continual rounds after r3")
    ap.add_argument("--pool-n", type=int, default=24, help="prompts in each round's pool")
    ap.add_argument("--faults", type=int, default=6, help="job kills + Snakemake SIGTERMs")
    ap.add_argument("--seed", type=int, default=0, help="the injector's RNG seed")
    ap.add_argument("--root", type=Path, required=True, help="working folder (wiped parts)")
    ap.add_argument("--out", type=Path, help="the JSON report (default ROOT/soak.json)")
    ap.add_argument("--tmpfs-size", default="1g", help="the faulty run's results disk")
    ap.add_argument("--no-disk-full", action="store_true", help="skip the disk-full fault")
    ap.add_argument("--disk-full-hold", type=float, default=60, help="s the disk stays full")
    ap.add_argument(
        "--shared-prefix",
        action="store_true",
        help=f"build {', '.join(PREFIX)} once, uninterrupted, and start both runs from a copy "
        "(bundles/Bdose left out): faults land only in the continual rounds and the last "
        "round's bundle",
    )
    ap.add_argument("--reference", type=Path, help="an uninterrupted run's results, reused")
    ap.add_argument("--reference-wall", type=float, default=300, help="its wall, if reused")
    ap.add_argument("--extra-attempts", type=int, default=2, help="reruns beyond one a fault")
    ap.add_argument("--attempt-timeout", type=float, default=3600, help="s per snakemake call")
    ap.add_argument("--keep-mount", action="store_true", help="leave the tmpfs mounted")
    ap.add_argument(
        "--recheck",
        action="store_true",
        help="run nothing: compare again the results of the report --out names (the faulty "
        "run's from ROOT/faulty-results) and rewrite its records and checks",
    )
    return ap.parse_args(argv)


def write(report: dict, out: Path) -> int:
    report["checks"] = checks(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)
    print(summary(report))
    print(f"report: {out}")
    return 0 if all(report["checks"].values()) else 1


def recheck(root: Path, out: Path) -> int:
    report = json.loads(out.read_text())
    report["reference"]["records"] = final_records(Path(report["reference"]["results"]))
    copied = root / "faulty-results"  # the tmpfs's copy; without a tmpfs, where it ran
    results = copied if copied.is_dir() else Path(report["faulty"]["results"])
    report["faulty"]["records"] = final_records(results)
    for fault in report["faulty"]["faults"]:  # reports written before faults kept their rc
        fault.setdefault("attempt_rc", report["faulty"]["attempts"][fault["attempt"]]["rc"])
    return write(report, out)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.shared_prefix and args.reference:
        raise SystemExit("--shared-prefix and --reference: a reused run has no prefix to share")
    root = args.root.resolve()
    if args.recheck:
        return recheck(root, args.out or root / "soak.json")
    root.mkdir(parents=True, exist_ok=True)
    arms = root / "arms"
    shutil.rmtree(arms, ignore_errors=True)
    shutil.copytree(REPO / "config/arms", arms)
    extra = root / "soak.yaml"
    extra.write_text(yaml.safe_dump(overlay(args.rounds, args.pool_n)))
    t0 = time.monotonic()
    prefix = shared_prefix(args, root, extra, arms) if args.shared_prefix else None
    ref = uninterrupted(args, root, extra, arms, prefix)
    report = {
        "argv": sys.argv if argv is None else argv,
        "seed": args.seed,
        "rounds": args.rounds,
        "targets": targets(args.rounds, args.shared_prefix),
        "code": manifest.code_version(),
        "prefix": prefix,
        "reference": ref,
    }
    wall = ref.get("wall_s", args.reference_wall)
    report["faulty"] = faulty(args, root, extra, arms, wall, prefix)
    ref["records"] = final_records(Path(ref["results"]))  # a reused run may finish meanwhile
    report["wall_s"] = round(time.monotonic() - t0, 1)
    return write(report, args.out or root / "soak.json")


if __name__ == "__main__":
    sys.exit(main())
