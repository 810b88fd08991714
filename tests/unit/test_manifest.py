"""arenaflow.manifest: sha256 manifests written and verified."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from arenaflow import manifest


@pytest.fixture
def outdir(tmp_path):
    d = tmp_path / "out"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("alpha\n")
    (d / "sub" / "b.bin").write_bytes(bytes(range(256)))
    (d / "c.json").write_text('{"x": 1}\n')
    return d


def test_write_lists_every_file_with_sha256_and_size(outdir):
    rec = manifest.write(outdir, params={"k": 4})
    assert set(rec["files"]) == {"a.txt", "sub/b.bin", "c.json"}
    assert rec["files"]["sub/b.bin"] == {
        "sha256": hashlib.sha256(bytes(range(256))).hexdigest(),
        "bytes": 256,
    }
    assert rec["files"]["a.txt"]["sha256"] == hashlib.sha256(b"alpha\n").hexdigest()
    assert rec["params"] == {"k": 4}
    assert json.loads((outdir / "manifest.json").read_text())["files"] == rec["files"]


def test_digest_is_sha256_of_sorted_relpath_tab_sha_lines(outdir):
    rec = manifest.write(outdir)
    lines = "".join(
        f"{rel}\t{hashlib.sha256((outdir / rel).read_bytes()).hexdigest()}\n"
        for rel in sorted(["a.txt", "c.json", "sub/b.bin"])
    )
    assert rec["digest"] == hashlib.sha256(lines.encode()).hexdigest()


def test_digest_depends_on_content_only(tmp_path, outdir):
    other = tmp_path / "copy"
    (other / "sub").mkdir(parents=True)
    for rel in ("a.txt", "sub/b.bin", "c.json"):
        (other / rel).write_bytes((outdir / rel).read_bytes())
    a = manifest.write(outdir, params={"lr": 1})
    b = manifest.write(other, params={"lr": 2})
    assert a["digest"] == b["digest"]


def test_write_then_verify_round_trips(outdir):
    rec = manifest.write(outdir)
    assert manifest.verify(outdir)["digest"] == rec["digest"]


def test_flipping_one_byte_names_that_file(outdir):
    manifest.write(outdir)
    p = outdir / "sub" / "b.bin"
    data = bytearray(p.read_bytes())
    data[100] ^= 0x01  # same size, different content
    p.write_bytes(bytes(data))
    with pytest.raises(manifest.ManifestError, match=r"sub/b\.bin: sha256 .* does not match"):
        manifest.verify(outdir)


def test_missing_file_is_named(outdir):
    manifest.write(outdir)
    (outdir / "c.json").unlink()
    with pytest.raises(manifest.ManifestError, match=r"c\.json: listed in .* but missing"):
        manifest.verify(outdir)


def test_extra_file_is_named(outdir):
    manifest.write(outdir)
    (outdir / "sub" / "extra.txt").write_text("late\n")
    with pytest.raises(manifest.ManifestError, match=r"sub/extra\.txt: present but not listed"):
        manifest.verify(outdir)


def test_snakemake_timestamp_is_ignored(outdir):
    (outdir / ".snakemake_timestamp").write_text("1")
    rec = manifest.write(outdir)
    assert ".snakemake_timestamp" not in rec["files"]
    (outdir / ".snakemake_timestamp").write_text("2")  # touched later by Snakemake
    manifest.verify(outdir)
    (outdir / ".snakemake_timestamp").unlink()
    manifest.verify(outdir)


def test_manifest_does_not_list_itself(outdir):
    manifest.write(outdir)
    rec = manifest.write(outdir)  # a second write sees the first manifest.json on disk
    assert "manifest.json" not in rec["files"]


def test_edited_digest_is_detected(outdir):
    manifest.write(outdir)
    path = outdir / "manifest.json"
    rec = json.loads(path.read_text())
    rec["digest"] = "0" * 64
    path.write_text(json.dumps(rec))
    with pytest.raises(manifest.ManifestError, match="digest does not match"):
        manifest.verify(outdir)


def test_directory_without_manifest_fails(outdir):
    with pytest.raises(manifest.ManifestError, match="no manifest"):
        manifest.verify(outdir)


def test_sha256_file_matches_hashlib_across_chunks(tmp_path):
    data = bytes(range(256)) * (manifest.CHUNK // 256 + 3)  # longer than one read chunk
    p = tmp_path / "big.bin"
    p.write_bytes(data)
    assert manifest.sha256_file(p) == hashlib.sha256(data).hexdigest()


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "arenaflow.manifest", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_verify_exits_0_on_intact_and_1_on_tampered_dir(outdir):
    manifest.write(outdir)
    ok = _cli("verify", outdir)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("OK ")
    (outdir / "a.txt").write_text("alphA\n")
    bad = _cli("verify", outdir)
    assert bad.returncode == 1
    assert "a.txt" in bad.stderr and "FAIL" in bad.stderr


def test_code_version_asks_git_once_per_process(monkeypatch):
    """The commit a process records is the one it found first (the code it imported): a
    training's save records it without running git while the GPU waits."""
    first = manifest.code_version()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=manifest.Path(manifest.__file__).parent,
        capture_output=True,
        text=True,
    )
    if head.returncode == 0:
        assert first["git_commit"] == head.stdout.strip()

    def no_git(*a, **k):
        raise AssertionError("git ran again")

    monkeypatch.setattr(subprocess, "run", no_git)
    first["git_commit"] = "edited by a caller"
    again = manifest.code_version()
    assert again["git_commit"] != "edited by a caller" and again["python"] == first["python"]


def test_a_copy_without_its_history_records_the_commit_its_runner_declares(monkeypatch):
    """The GPU machine's copy carries another commit's .git; a `git archive` none. The runner's
    word is recorded apart from git's own answer, never in its place."""
    manifest._code_version.cache_clear()
    monkeypatch.setenv(manifest.SOURCE_COMMIT, "0123abc")
    try:
        info = manifest.code_version()
        assert info["declared_commit"] == "0123abc" and "git_commit" in info
        monkeypatch.delenv(manifest.SOURCE_COMMIT)
        manifest._code_version.cache_clear()
        assert "declared_commit" not in manifest.code_version()
    finally:
        manifest._code_version.cache_clear()
