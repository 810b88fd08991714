"""benchmarks/soak.py's bookkeeping, without running a DAG: which outputs it counts as complete
(read from Snakemake's own records, named as Snakemake's persistence names them), what it calls
recomputed, what it compares between two runs, and the faults it plans."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import types
from pathlib import Path

import pytest
from snakemake.persistence.file import FilePersistence

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def soak(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import soak

    return soak


def record(results: Path, kind: str, output: str, end: float, max_len: int = 255) -> None:
    """A record where Snakemake's FilePersistence puts it (`max_len` small: split into folders)."""
    me = types.SimpleNamespace(_fetch_max_len=lambda subject: max_len)
    path = Path(FilePersistence._record_path(me, str(results / ".snakemake" / kind), output))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"endtime": end, "incomplete": kind == "incomplete"}))


@pytest.fixture
def results(tmp_path):
    for rel in ("pools/p.jsonl", "runs/A/final/w.bin", "runs/A/final/.snakemake_timestamp"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    (tmp_path / "nominations/journal.jsonl").parent.mkdir()
    (tmp_path / "nominations/journal.jsonl").write_text("{}\n")  # no rule's output
    (tmp_path / "candidates/c/samples.jsonl").parent.mkdir(parents=True)
    (tmp_path / "candidates/c/samples.jsonl").write_text("half")
    record(tmp_path, "metadata", "pools/p.jsonl", 1.0)
    record(tmp_path, "metadata", "runs/A/final", 2.0, max_len=8)  # a long name's folders
    record(tmp_path, "metadata", "candidates/c/samples.jsonl", 3.0)
    record(tmp_path, "incomplete", "candidates/c/samples.jsonl", 3.0)
    return tmp_path


def test_complete_outputs_are_those_snakemake_recorded_and_did_not_mark_incomplete(soak, results):
    snap = soak.snapshot(results)
    assert sorted(snap) == ["pools/p.jsonl", "runs/A/final/w.bin"]
    assert snap["runs/A/final/w.bin"][0] == 2.0


def test_an_output_written_again_or_deleted_counts_as_recomputed(soak, results):
    before = soak.snapshot(results)
    assert soak.rewritten(before, results) == []
    (results / "pools/p.jsonl").write_text("pools/p.jsonl")  # same bytes, a new write
    os.utime(results / "pools/p.jsonl", ns=(1, 1))
    (results / "runs/A/final/w.bin").unlink()
    assert [c["path"] for c in soak.rewritten(before, results)] == [
        "pools/p.jsonl",
        "runs/A/final/w.bin",
    ]


def test_two_runs_compare_equal_up_to_times_and_differ_on_a_verdict(soak, tmp_path):
    nom = {
        "promoted": "B3",
        "registered_utc": "2026-12-07T12:00:00+00:00",
        "inputs": {"compare/x.json": "ab"},
        "digest": "cd",
        "clauses": [{"metric": "delta", "value": 0.1, "verdict": True}],
    }
    for run, changes in (
        ("a", {}),
        ("b", {"registered_utc": "2026-12-07T13:00:00+00:00", "digest": "ef"}),
        ("c", {"promoted": "R2d"}),
    ):
        path = tmp_path / run / "nominations/r3.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({**nom, **changes}))
    a, b, c = (soak.final_records(tmp_path / r) for r in "abc")
    assert a == b and list(a) == ["nominations/r3.json"]
    assert a != c


def test_a_bundle_card_compares_without_its_nominations_time_and_digest(soak, tmp_path):
    card = "Sealed nomination, digest `{d}`: the bar was registered {t}; promoted {arm}\n"
    texts = [
        card.format(d="a" * 64, t="2026-12-07T12:33:27.459447+00:00", arm="B3"),
        card.format(d="b" * 64, t="2026-12-07T13:01:02.5+00:00", arm="B3"),
        card.format(d="a" * 64, t="2026-12-07T12:33:27.459447+00:00", arm="R2d"),
    ]
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"{i}/README.md")
        paths[-1].parent.mkdir()
        paths[-1].write_text(text)
    a, b, c = map(soak.file_record, paths)
    assert a == b != c


def test_the_plan_has_both_signal_faults_and_one_full_disk(soak):
    for n in (2, 3, 6):
        kinds = soak.plan(random.Random(n), n, disk=True)
        assert kinds.count("disk_full") == 1 and len(kinds) == n + 1
        assert kinds.count("kill_job") == (n + 1) // 2 and kinds.count("term_snakemake") == n // 2
    assert "disk_full" not in soak.plan(random.Random(0), 2, disk=False)


def test_a_copied_prefix_is_complete_as_it_was_and_the_ci_targets_leave_its_bundles(
    soak, results, tmp_path
):
    copy = tmp_path / "copy/results"
    soak.seed({"results": str(results)}, copy)
    # Snakemake's records and the mtimes came along: nothing the prefix made counts as rewritten
    assert soak.snapshot(copy) == soak.snapshot(results)
    assert soak.rewritten(soak.snapshot(results), copy) == []
    soak.seed(None, copy)
    assert not copy.exists()
    assert soak.PREFIX[0] == f"nominations/{soak.AFTER}.json"
    assert soak.targets(2, shared_prefix=True) == ["rounds/r5.json", "bundles/Bsoak"]
    assert set(soak.PREFIX_BUNDLES) < set(soak.targets(2, shared_prefix=False))


def report_of(faults: list[dict], ref_recomputed: list) -> dict:
    records = {"nominations/r4.json": "ab"}
    attempt = {"rc": 0, "fault": None, "strays": 0}
    return {
        "reference": {"records": records, "recomputed_complete": ref_recomputed},
        "faulty": {
            "planned": [f["kind"] for f in faults],
            "faults": faults,
            "attempts": [attempt],
            "recomputed_complete": [],
            "records": records,
        },
    }


def test_a_fault_that_hit_no_running_job_or_a_full_disk_nothing_wrote_fails_its_check(soak):
    kill = {"kind": "kill_job", "process": "python -m arenaflow.train --arm"}
    term = {"kind": "term_snakemake", "jobs_running": ["arenaflow.train --arm"]}
    full = {**term, "kind": "disk_full", "attempt_failed_while_full": True}
    landed = "every fault landed while a job ran"
    assert all(soak.checks(report_of([kill, term, full], [])).values())
    for bad in ({**term, "jobs_running": []}, {**full, "attempt_failed_while_full": False},
                {**full, "attempt_failed_while_full": False, "attempt_rc": 0}):  # fmt: skip
        assert not soak.checks(report_of([kill, bad], []))[landed]
    # a job failed on the full disk; Snakemake exited once the other running job had ended
    later = {**full, "attempt_failed_while_full": False, "attempt_rc": 1}
    assert soak.checks(report_of([kill, later], []))[landed]
    # the reference run rewrote an output of the shared prefix
    ran_again = soak.checks(report_of([kill], [{"path": "pools/p.jsonl"}]))
    assert not ran_again["0 complete outputs recomputed"]
    assert [k for k, ok in ran_again.items() if not ok] == ["0 complete outputs recomputed"]


def test_a_file_of_a_job_that_still_owes_a_sibling_output_is_not_complete(soak, tmp_path):
    # Snakemake itself says what it owes: a job with two outputs that wrote one and died
    (tmp_path / "Snakefile").write_text(
        'rule two:\n    output: "a.txt", "b.txt"\n    shell: "touch {output}"\n'
    )
    (tmp_path / "a.txt").write_text("a")
    record(tmp_path, "metadata", "a.txt", 1.0)
    snake = [sys.executable, "-m", "snakemake", "-s", str(tmp_path / "Snakefile")]
    cmd = [*snake, "-d", str(tmp_path), "a.txt", "b.txt", "--cores", "1"]
    owed = soak.pending(cmd)
    assert owed == {"a.txt", "b.txt"}
    assert "a.txt" in soak.snapshot(tmp_path) and soak.snapshot(tmp_path, owed) == {}
    subprocess.run(cmd, check=True, capture_output=True)  # the job done: nothing owed
    assert soak.pending(cmd) == frozenset()
    assert sorted(soak.snapshot(tmp_path, soak.pending(cmd))) == ["a.txt", "b.txt"]
