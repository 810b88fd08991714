"""The GPU tier cannot rot unseen: every gpu-marked test has a case without the marker (the same
test on CPU, which CI runs) or a row in README.md's table of CUDA-only tests, which names the CPU
tests of its code; without CUDA every gpu-marked test skips by its marker instead of failing."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import torch

SECTION = "### GPU tests"
TEST_ID = re.compile(r"`(tests/[\w/]+\.py::\w+)`")
GPU_MARKING = re.compile(r"mark\.gpu|from devices import")


def cuda_only(readme: str) -> dict[str, list[str]]:
    """README's table of CUDA-only tests: each test's id -> the ids of its CPU tests."""
    section = readme.split(SECTION, 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| `tests/")]
    return {TEST_ID.findall(row[0])[0]: TEST_ID.findall(row[2]) for row in rows}


def problems(records: list[dict], listed: dict[str, list[str]], cuda: bool) -> list[str]:
    """What keeps the GPU tier from being checked on CPU, one line each. `records`: collected
    tests (id, gpu, skipped by a marker here); ids in `listed` are checked where their file was
    collected."""
    by_test: dict[str, list[dict]] = {}
    for r in records:
        by_test.setdefault(r["id"].split("[")[0], []).append(r)
    files = {t.split("::")[0] for t in by_test}

    def on_cpu(test: str) -> bool:
        return any(not r["gpu"] and not r["skipped"] for r in by_test.get(test, []))

    out = []
    for test, cases in sorted(by_test.items()):
        if any(r["gpu"] for r in cases) and not on_cpu(test) and test not in listed:
            out.append(f"{test}: marked gpu, with no case on CPU and no row in README's table")
        if not cuda:  # a marker's skipif (tests/unit/devices.py's CUDA), not an error at run time
            runs = [r["id"] for r in cases if r["gpu"] and not r["skipped"]]
            out += [f"{r}: marked gpu, and not skipped without CUDA" for r in runs]
    for test, cpu_tests in listed.items():
        if test.split("::")[0] not in files:
            continue
        if not any(r["gpu"] for r in by_test.get(test, [])):
            out.append(f"{test}: in README's table, but no such gpu-marked test")
        elif on_cpu(test):
            out.append(f"{test}: in README's table, but it has a case on CPU")
        if not cpu_tests:
            out.append(f"{test}: README's table names no CPU test of its code")
        for c in cpu_tests:
            if c.split("::")[0] in files and not on_cpu(c):
                out.append(f"{test}: README's CPU test {c} is not collected or not on CPU")
    return out


def test_every_gpu_test_runs_on_cpu_or_is_listed_as_cuda_only(collected_tests, repo_root, tmp_path):
    """From this session's collection where it took in every test file (the README's and CI's
    commands); otherwise, in a process of its own, the files that can mark a test gpu (the
    marker, or tests/unit/devices.py's cases) and those README's table names."""
    readme = (repo_root / "README.md").read_text()
    listed = cuda_only(readme)
    records = collected_tests
    every = {str(p.relative_to(repo_root)) for p in (repo_root / "tests").rglob("test_*.py")}
    if not every <= {r["id"].split("::")[0] for r in records}:
        marking = {f for f in every if GPU_MARKING.search((repo_root / f).read_text())}
        named = {t.split("::")[0] for t in TEST_ID.findall(readme.split(SECTION, 1)[1])}
        out = tmp_path / "collected.json"
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        cmd += ["-o", "addopts=", f"--collected-json={out}", *sorted(marking | named)]
        subprocess.run(cmd, cwd=repo_root, capture_output=True, check=True, timeout=300)
        records = json.loads(out.read_text())
    assert sum(r["gpu"] for r in records) > 20  # not vacuous: the tier was collected
    found = problems(records, listed, torch.cuda.is_available())
    assert not found, "\n".join(found)


def test_the_check_names_an_unlisted_gpu_test_a_stale_row_and_a_lost_cpu_test():
    records = [
        {"id": "tests/unit/test_a.py::test_x[cpu]", "gpu": False, "skipped": False},
        {"id": "tests/unit/test_a.py::test_x[cuda]", "gpu": True, "skipped": True},
        {"id": "tests/unit/test_a.py::test_y", "gpu": True, "skipped": True},
        {"id": "tests/unit/test_a.py::test_z", "gpu": True, "skipped": False},
        {"id": "tests/unit/test_a.py::test_w", "gpu": False, "skipped": True},
    ]
    listed = {
        "tests/unit/test_a.py::test_z": ["tests/unit/test_a.py::test_w"],
        "tests/unit/test_a.py::test_x": ["tests/unit/test_a.py::test_x"],
        "tests/unit/test_a.py::test_gone": [],
        "tests/gpu/test_b.py::test_v": ["tests/unit/test_a.py::test_gone"],  # file not collected
    }
    a = "tests/unit/test_a.py::"
    assert problems(records, listed, cuda=False) == [
        f"{a}test_y: marked gpu, with no case on CPU and no row in README's table",
        f"{a}test_z: marked gpu, and not skipped without CUDA",
        f"{a}test_z: README's CPU test {a}test_w is not collected or not on CPU",
        f"{a}test_x: in README's table, but it has a case on CPU",
        f"{a}test_gone: in README's table, but no such gpu-marked test",
        f"{a}test_gone: README's table names no CPU test of its code",
    ]
    # test_z skipped without CUDA, its CPU test running here, test_y gone: nothing to say
    records[3]["skipped"], records[4]["skipped"] = True, False
    assert problems(records[:2] + records[3:], {f"{a}test_z": [f"{a}test_w"]}, cuda=False) == []


def test_readmes_table_is_read_row_by_row(repo_root):
    listed = cuda_only((repo_root / "README.md").read_text())
    multi = (
        "tests/gpu/test_multi_gpu.py::test_two_gpus_match_one_reload_and_resume_across_world_sizes"
    )
    assert listed[multi] == [
        "tests/e2e/test_multi_rank_resume.py::"
        "test_four_ranks_resume_through_two_to_the_uninterrupted_runs_weights"
    ]
    assert len(listed) >= 5 and all(listed.values())
