"""sha256 manifests: every output directory lists sha256 + size of each file and one digest.

    python -m arenaflow.manifest verify DIR      # exit 1 naming the first changed/missing file

Every consumer verifies what it reads before using it (`require`): sampling and readouts the
policy's run directory, training its init arm's and its corpus, bundles every run and corpus
they copy or cite. Single-file records are sealed instead (`seal`, `check_seal`), and a record
that pooled other files lists their sha256 for `check_file`.

The digest is the sha256 of the sorted "relpath<TAB>sha256<LF>" lines, so it identifies the
directory's content and nothing else (not times, not params). Snakemake's
`.snakemake_timestamp` marker and the manifest itself are never listed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from arenaflow import __version__, io, knobs, paths

MANIFEST = "manifest.json"
SKIP = {MANIFEST, ".snakemake_timestamp"}
CHUNK = 1 << 20


def sha256_file(path: str | os.PathLike, chunk_size: int = CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def list_files(root: Path) -> dict[str, dict]:
    files = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        # .*.tmp are arenaflow.io's in-flight atomic writes, never part of an output
        tmp = p.name.startswith(".") and p.name.endswith(".tmp")
        if p.is_file() and p.name not in SKIP and not tmp:
            files[rel] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    return files


def digest_of(files: dict[str, dict]) -> str:
    return sha256_text("".join(f"{k}\t{files[k]['sha256']}\n" for k in sorted(files)))


SOURCE_COMMIT = knobs.SOURCE_COMMIT


def code_version() -> dict:
    """The package version and, when run from a git checkout, its commit and dirtiness, as this
    process found them first: the code it imported then is the code it runs."""
    return dict(_code_version())


@functools.cache
def _code_version() -> dict:
    # two git processes, once: a training wrote them three times, two in its save, while the
    # GPU idled
    here = Path(__file__).resolve().parent
    info = {"arenaflow": __version__, "python": platform.python_version()}
    try:
        run = lambda *a: subprocess.run(  # noqa: E731
            ["git", *a], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        info["git_commit"] = run("rev-parse", "HEAD")
        info["git_dirty"] = bool(run("status", "--porcelain", "--", str(here)))
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    # A copy of the tree without its own history (a `git archive`, the GPU machine's copy, whose
    # .git is another commit's): the commit its runner says it is, recorded as said, not checked
    declared = knobs.get(SOURCE_COMMIT)
    if declared:
        info["declared_commit"] = declared
    return info


# Where a directory was written, as its last two path components ("B3/final", "corpora/rft_r1"):
# enough to tell two arms' or corpora's outputs apart, and unchanged when a whole results
# directory moves.
WRITTEN_AS = "written_as"


def place(path: str | os.PathLike) -> str:
    return "/".join(Path(os.path.abspath(path)).parts[-2:])


def write(
    root: str | os.PathLike,
    params: dict | None = None,
    extra: dict | None = None,
    written_as: str | os.PathLike | None = None,
) -> dict:
    """Write root/manifest.json for the files now in root; return it. `written_as`: the path
    the directory is written for (root is often its temporary twin), checked by verify()."""
    root = Path(root)
    files = list_files(root)
    record = {
        "files": files,
        "digest": digest_of(files),
        "params": params or {},
        "code": code_version(),
        "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        **({WRITTEN_AS: place(written_as)} if written_as is not None else {}),
        **(extra or {}),
    }
    io.write_json(root / MANIFEST, record)
    return record


class ManifestError(ValueError):
    pass


def verify(root: str | os.PathLike) -> dict:
    """Check every listed file against the manifest; raise ManifestError naming the first
    file that is missing, changed or unlisted. Return the manifest."""
    root = Path(root)
    path = root / MANIFEST
    if not path.exists():
        raise ManifestError(f"{path}: no manifest; the directory is incomplete or not arenaflow's")
    record = io.read_json(path)
    actual = list_files(root)
    for rel, meta in record["files"].items():
        if rel not in actual:
            raise ManifestError(f"{root / rel}: listed in {path} but missing")
        if actual[rel]["sha256"] != meta["sha256"]:
            raise ManifestError(
                f"{root / rel}: sha256 {actual[rel]['sha256']} does not match the manifest's "
                f"{meta['sha256']} (file changed after the manifest was written)"
            )
    for rel in actual:
        if rel not in record["files"]:
            raise ManifestError(f"{root / rel}: present but not listed in {path}")
    if digest_of(record["files"]) != record["digest"]:
        raise ManifestError(f"{path}: digest does not match its own file list (manifest edited)")
    written = record.get(WRITTEN_AS)
    if written is not None and written != place(root):
        raise ManifestError(
            f"{path}: written as {written}, found at {place(root)} (a directory moved, "
            "swapped or restored from elsewhere: its contents belong to the other name)"
        )
    return record


def require(root: str | os.PathLike, consumer: str) -> dict:
    """verify(), for a step about to read `root`: the error also says which step refused, so
    a failed job's log names both the changed file and who would have consumed it."""
    try:
        return verify(root)
    except ManifestError as e:
        raise ManifestError(f"{consumer} refused {root}: {e}") from None


# Single-file records (compare and noise JSONs) carry their own sha256: a directory manifest
# would need a second output per rule, and the seal travels with the file when it is copied.
SEAL = "sealed_sha256"


def _canonical(record: dict) -> str:
    # a JSON round trip first, so a record hashes the same before writing and after reading
    # (tuples become lists, int keys strings) whatever the writer's indentation
    body = json.loads(json.dumps({k: v for k, v in record.items() if k != SEAL}))
    return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def seal(record: dict) -> dict:
    """`record` with SEAL: the sha256 of its canonical JSON without the seal."""
    return {**record, SEAL: sha256_text(_canonical(record))}


def check_seal(record: dict, path: str | os.PathLike) -> dict:
    """Raise ManifestError naming `path` unless `record` (read from it) carries its seal and
    still matches it; return the record."""
    if SEAL not in record:
        raise ManifestError(
            f"{path}: no {SEAL}; written before records were sealed or not by "
            "arenaflow: rebuild it (snakemake --forcerun on its rule)"
        )
    if sha256_text(_canonical(record)) != record[SEAL]:
        raise ManifestError(
            f"{path}: content does not match its {SEAL} (file changed after it was written)"
        )
    return record


# Single-file outputs that later steps read whole (pools, samples, verdicts) carry a manifest of
# their own beside them: a deleted pool row, a duplicated sample or a flipped verdict would
# otherwise be read as written.
def sidecar(path: str | os.PathLike) -> Path:
    """pools/P.jsonl -> pools/P.manifest.json"""
    return Path(path).with_suffix(".manifest.json")


def write_file(
    path: str | os.PathLike, params: dict | None = None, rows: int | None = None
) -> dict:
    """Write the sidecar manifest of the file now at `path` (written whole before); return it."""
    record = {
        "file": Path(path).name,
        "sha256": sha256_file(path),
        "bytes": os.path.getsize(path),
        **({"rows": rows} if rows is not None else {}),
        "params": params or {},
        "code": code_version(),
        "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        WRITTEN_AS: place(path),
    }
    io.write_json(sidecar(path), record)
    return record


def require_file(path: str | os.PathLike, consumer: str, required: bool = True) -> dict | None:
    """Check `path` against its sidecar manifest before `consumer` reads it; ManifestError
    names the file. Without a sidecar: refused if `required`, else None (a file made by hand,
    outside the workflow's layout)."""
    side = sidecar(path)
    if not side.exists():
        if not required:
            return None
        raise ManifestError(
            f"{consumer} refused {path}: no {side.name} beside it; the file is incomplete or "
            "not the workflow's (rebuild it: snakemake --forcerun on its rule)"
        )
    record = io.read_json(side)
    try:
        check_file(path, record["sha256"], side)
    except ManifestError as e:
        raise ManifestError(f"{consumer} refused {path}: {e}") from None
    if record.get(WRITTEN_AS) not in (None, place(path)):
        raise ManifestError(
            f"{consumer} refused {path}: {side} says it was written as {record[WRITTEN_AS]} "
            "(a file moved, swapped or restored from elsewhere)"
        )
    return record


def require_output(path: str | os.PathLike, consumer: str, pattern: str) -> dict | None:
    """require_file for a workflow output named by `pattern` (paths.POOL, paths.SAMPLES, ...):
    its sidecar is required where the path lies in the workflow's layout."""
    return require_file(path, consumer, required=paths.parse(pattern, path) is not None)


def read_jsonl(path: str | os.PathLike, consumer: str, pattern: str) -> list[dict]:
    """A JSONL output's rows, once its sidecar manifest verifies (require_output)."""
    require_output(path, consumer, pattern)
    return io.read_jsonl(path)


def check_file(path: str | os.PathLike, sha256: str, recorded_in: str | os.PathLike) -> None:
    """Raise ManifestError naming `path` unless it still has the sha256 `recorded_in` holds."""
    if not Path(path).is_file():
        raise ManifestError(f"{path}: recorded in {recorded_in} but missing")
    actual = sha256_file(path)
    if actual != sha256:
        raise ManifestError(
            f"{path}: sha256 {actual} does not match the {sha256} recorded in "
            f"{recorded_in} (file changed after it was recorded)"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Verify arenaflow manifests.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="verify DIR/manifest.json against DIR")
    v.add_argument("dirs", nargs="+", help="directories holding a manifest.json")
    args = ap.parse_args(argv)
    failed = 0
    for d in args.dirs:
        try:
            rec = verify(d)
            print(f"OK {d} digest {rec['digest']}")
        except ManifestError as e:
            print(f"FAIL {e}", file=sys.stderr)
            failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
