"""What verifying its inputs costs each job of a built DAG (chain of custody).

    python benchmarks/verify_cost.py RESULTS_DIR [--repeats 5] [--hash-mib 256] [--out verify.json]

Each consumer's verification, as the job runs it, on the DAG's own artifacts (best of
--repeats, files in the page cache): sampling and readouts (one arm's run directory),
training (its init arm, twice: before loading and in the checkpoint fingerprint, and its
corpus), compare (page checksums while reading the readouts, and their sha256 for the record),
nomination (every compare and noise seal and the readouts they pooled) and bundles (every run
and corpus of the served arm's lineage, and the compare seals its card cites). Then
manifest.sha256_file's rate on one --hash-mib file of random bytes, to scale to larger
artifacts than the embedded default's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import timeit
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from arenaflow import io, manifest
from arenaflow.bundles import sources
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout_file


def best(fn, repeats: int) -> float:
    # best-of-N: the machine is shared, and the fastest run is the least disturbed one
    return min(timeit.repeat(fn, "gc.enable()", number=1, repeat=repeats, globals={"gc": gc}))


def size(paths) -> int:
    return sum(p.stat().st_size for d in paths for p in Path(d).rglob("*") if p.is_file())


def row(job: str, what: str, nbytes: int, seconds: float) -> dict:
    return {"job": job, "what": what, "bytes": nbytes, "seconds": seconds}


def lineage(arm: str) -> list[str]:
    """The arm and its ancestors, from each run's evidence (a merge's parents, a trained arm's
    init)."""
    out, todo = [], [arm]
    while todo:
        a = todo.pop(0)
        if a == "base" or a in out:
            continue
        out.append(a)
        run = Path("runs") / a / "final"
        ev = io.read_json(run / sources.evidence_file(run))
        todo += [p["arm"] for p in ev["parents"]] if "parents" in ev else [ev["init"]]
    return out


def trained(arms: list[str]) -> list[str]:
    return [a for a in arms if (Path("runs") / a / "final/training_evidence.json").exists()]


def runs_and_training(repeats: int) -> list[dict]:
    rows = []
    for run in sorted(Path("runs").glob("*/final")):
        rows.append(
            row(
                "sample_candidates / readout",
                f"{run}",
                size([run]),
                best(lambda r=run: manifest.require(r, "bench"), repeats),
            )
        )
        if not trained([run.parent.name]):
            continue  # a merge arm: it trains on nothing
        ev = io.read_json(run / "training_evidence.json")
        corpus = Path("corpora") / ev["corpus"]
        init = [] if ev["init"] == "base" else [Path("runs") / ev["init"] / "final"] * 2
        rows.append(
            row(
                "train_arm",
                f"{run.parent.name}: init x{len(init)} + {corpus}",
                size([*init, corpus]),
                best(
                    lambda i=init, c=corpus: [manifest.require(d, "bench") for d in [*i, c]],
                    repeats,
                ),
            )
        )
    return rows


def compares(repeats: int) -> list[dict]:
    rows = []
    for path in sorted(Path("compare").rglob("*.json")):
        srcs = [s["path"] for s in comparisons.pooled(io.read_json(path))]
        plain = best(lambda s=srcs: [pd.read_parquet(p) for p in s], repeats)
        checked = best(lambda s=srcs: [readout_file.read_readout(p) for p in s], repeats)
        hashed = best(lambda s=srcs: [manifest.sha256_file(p) for p in s], repeats)
        rows.append(
            row(
                "compare",
                f"{path}: page CRCs + sha256 of {len(srcs)} readouts",
                sum(os.path.getsize(p) for p in srcs),
                max(checked - plain, 0.0) + hashed,
            )
        )
    return rows


def nomination_and_bundle(repeats: int) -> list[dict]:
    comps = sorted(map(str, Path("compare").rglob("*.json")))
    noise = sorted(map(str, Path("noise").rglob("*.json")))
    readouts = sorted(
        {s["path"] for p in comps + noise for s in comparisons.pooled(io.read_json(p))}
    )
    rows = [
        row(
            "nominate (every compare and noise file: an upper bound)",
            f"{len(comps)} compare + {len(noise)} noise seals, {len(readouts)} readouts",
            sum(os.path.getsize(p) for p in comps + noise + readouts),
            best(lambda: comparisons.verify_judged(comps, noise, readouts), repeats),
        )
    ]
    for b in sorted(Path("bundles").glob("*/serving_config.json")):
        arms = lineage(io.read_json(b)["arm"])
        cites = [str(p) for a in arms for p in Path("compare").rglob(f"{a}__*.json")]
        args = SimpleNamespace(bundle=b.parent.name, runs="runs", corpora="corpora", compare=cites)
        corpora = {
            io.read_json(f"runs/{a}/final/training_evidence.json")["corpus"] for a in trained(arms)
        }
        rows.append(
            row(
                "build_bundle",
                f"{b.parent}: {len(arms)} runs, {len(corpora)} corpora, {len(cites)} compare seals",
                size([f"runs/{a}/final" for a in arms] + [f"corpora/{c}" for c in corpora]),
                best(lambda a=args, x=arms: sources.verify_sources(a, x[0], x[1:]), repeats),
            )
        )
    return rows


def hash_rate(mib: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "blob.bin"
        path.write_bytes(os.urandom(mib << 20))
        manifest.sha256_file(path)  # warm-up read: the page cache holds it from here
        return row(
            "sha256_file",
            f"{mib} MiB random file",
            mib << 20,
            best(lambda: manifest.sha256_file(path), repeats),
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a built results directory (snakemake bundles/B3f)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hash-mib", type=int, default=256)
    ap.add_argument("--out", default=None, help="optional JSON results")
    args = ap.parse_args()
    load_before = os.getloadavg()
    out = Path(args.out).resolve() if args.out else None
    rate = hash_rate(args.hash_mib, args.repeats)
    os.chdir(args.results)  # records name files relative to the results directory, as jobs run
    rows = (
        runs_and_training(args.repeats)
        + compares(args.repeats)
        + nomination_and_bundle(args.repeats)
    )
    for r in [rate, *rows]:
        print(
            f"{r['job']:<34} {r['bytes'] / 1e6:9.3f} MB {r['seconds'] * 1e3:9.2f} ms  {r['what']}"
        )
    print(
        f"sha256_file: {rate['bytes'] / rate['seconds'] / 1e6:.0f} MB/s; load average before "
        f"{load_before}, after {os.getloadavg()}"
    )
    if out:
        out.write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "rate": rate,
                    "jobs": rows,
                    "load_average": [load_before, os.getloadavg()],
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
