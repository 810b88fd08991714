"""Compare two results directories by content: is what a user sees the same?

    python scripts/compare_results.py RESULTS_A RESULTS_B     # exit 1 if any file differs

For checking that a change to the code (a refactor) changes no output of the main job: run it
from two checkouts into two results directories and compare them. Files are equal byte for byte,
or equal once what differs from run to run is set aside: times, the commit, local job ids, wall
and step times, the repository's own path, and every sha256 (a file holding a time has another
hash each run, and so has every record that names it). Parquet readouts compare their rows and
their metadata so read. Lists of strings compare as sets (PEFT writes target_modules from a set,
in the order of the process's hash seed). Logs and Snakemake's own state are not compared.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

VOLATILE_KEY = re.compile(
    r"(utc|sha256|digest|git_|job_id|wall|elapsed|seconds|_s$|gpu_hours|peak_|process_start"
    r"|^code$|^t$|^pid$|created|registered|^files$|^size$|bytes)"
)
SKIP = (".cache", ".snakemake", "logs")


def mask(text: str, root: Path) -> str:
    """Hashes (whole or cut short), times and local job ids out; the repository's path named."""
    text = text.replace(str(root.parent), "<repo>")
    text = re.sub(r"\b[0-9a-f]{12,64}\b", "<hex>", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT[\d:.+]+", "<time>", text)
    return re.sub(r"local-[\w.-]+-\d+", "<job>", text)


def normal(x, root: Path):
    if isinstance(x, dict):
        return {k: normal(v, root) for k, v in x.items() if not VOLATILE_KEY.search(k)}
    if isinstance(x, list):
        xs = [normal(v, root) for v in x]
        return sorted(xs) if all(isinstance(v, str) for v in xs) else xs
    return mask(x, root) if isinstance(x, str) else x


def content(path: Path, root: Path):
    """What a file says, run-to-run fields set aside; None for a file only bytes can compare."""
    if path.suffix == ".json":
        return normal(json.loads(path.read_text()), root)
    if path.suffix == ".jsonl":
        return [normal(json.loads(line), root) for line in path.read_text().splitlines() if line]
    if path.suffix == ".parquet":
        meta = pq.read_schema(path).metadata or {}
        read = {k.decode(): v.decode() for k, v in meta.items() if not k.startswith(b"pandas")}
        return pd.read_parquet(path).to_json(), {
            k: normal(json.loads(v), root) if v.startswith("{") else v for k, v in read.items()
        }
    if path.suffix in (".md", ".txt", ".html"):
        return mask(path.read_text(), root)
    return None


def files(root: Path) -> dict[str, Path]:
    return {
        str(p.relative_to(root)): p
        for p in root.rglob("*")
        if p.is_file()
        and not str(p.relative_to(root)).startswith(SKIP)
        and p.name != ".snakemake_timestamp"  # Snakemake's mark on a directory output
    }


def compare(a: Path, b: Path) -> dict:
    fa, fb = files(a), files(b)
    out = {"only_a": sorted(set(fa) - set(fb)), "only_b": sorted(set(fb) - set(fa))}
    out.update(bytes_equal=0, content_equal=0, differ=[])
    for rel in sorted(set(fa) & set(fb)):
        if fa[rel].read_bytes() == fb[rel].read_bytes():
            out["bytes_equal"] += 1
            continue
        got = content(fa[rel], a)
        if got is not None and got == content(fb[rel], b):
            out["content_equal"] += 1
        else:
            out["differ"].append(rel)
    return out


def main(argv: list[str] | None = None) -> None:
    a, b = map(Path, (argv or sys.argv[1:])[:2])
    r = compare(a, b)
    print(
        f"{r['bytes_equal']} files byte-identical, {r['content_equal']} equal but for run-to-run "
        f"fields, {len(r['differ'])} differ; {len(r['only_a'])} only in {a}, "
        f"{len(r['only_b'])} only in {b}"
    )
    for key in ("differ", "only_a", "only_b"):
        for rel in r[key]:
            print(f"  {key}: {rel}")
    raise SystemExit(1 if r["differ"] or r["only_a"] or r["only_b"] else 0)


if __name__ == "__main__":
    main()
