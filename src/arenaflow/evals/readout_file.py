"""A readout on disk: one parquet per (suite, arm, regime, replicate), arenaflow's metadata in its
schema (not its rows), page checksums verified on reading, its recorded identity checked against
its path, and readouts pooled for comparison (load). Separate from the rows
(arenaflow.evals.readout_rows, whose battery load recomputes for an old readout) and from the job
(arenaflow.evals.readout): compare, merges, bundles, budgets and nominations read readouts
without the job's CLI and model loading.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd

from arenaflow import io, manifest, paths
from arenaflow.evals import stats
from arenaflow.evals.readout_rows import structure

META_KEY = b"arenaflow"


def write_readout(df: pd.DataFrame, path: str | Path, meta: dict) -> None:
    """Parquet with arenaflow's metadata (created_utc, ...) in the schema, not in the rows, so
    two readouts of the same seed have identical rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
    record = {**meta, "created_utc": created, "code": manifest.code_version()}
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), META_KEY: json.dumps(record, sort_keys=True).encode()}
    )
    with io.atomic_path(path) as tmp:
        # CRC32 per page: a reader that asks (load) refuses a flipped bit instead of scoring it
        pq.write_table(table, tmp, write_page_checksum=True)


def readout_meta(path: str | Path) -> dict:
    """arenaflow's metadata of a readout parquet ({} for readouts written before it existed)."""
    import pyarrow.parquet as pq

    raw = (pq.read_schema(path).metadata or {}).get(META_KEY)
    return json.loads(raw) if raw else {}


def outcomes(df: pd.DataFrame, col: str, name: str) -> np.ndarray:
    """df[col] as bools; a value other than 0/1 (NaN included, which bool() would call correct)
    raises ValueError naming `name` and the offending row's item and replicate."""
    items = df["item_id"] if "item_id" in df else pd.Series(range(len(df)), index=df.index)
    reps = df["replicate"] if "replicate" in df else [None] * len(df)
    labels = [
        f"item {i!r}" + ("" if r is None else f", replicate {r}") for i, r in zip(items, reps)
    ]
    return stats.binary(df[col].to_numpy(), f"{name} ({col!r})", labels=labels)


def read_readout(path: str | Path) -> pd.DataFrame:
    """A readout, its page checksums verified (readouts written before they had checksums are
    read as they are) and its recorded identity matching its path (check_named); a bad page or
    a readout under another's name raises ManifestError naming the file."""
    try:
        df = pd.read_parquet(path, page_checksum_verification=True)
    except OSError as e:
        raise manifest.ManifestError(f"{path}: unreadable readout: {e}") from None
    check_named(path, readout_meta(path), df)
    return df


# what a readout's path says of it -> the metadata key that records it
NAMED = {"suite": "suite", "rarm": "arm", "regime": "regime", "rep": "replicate"}


def check_named(path: str | Path, meta: dict, df: pd.DataFrame) -> None:
    """A readout under readouts/{suite}/{arm}/{regime}.r{rep}.parquet must record that suite,
    arm, regime and replicate, and its rows that arm and replicate: a readout copied over
    another (the served regime's over the greedy one's, one replicate over another, one arm's
    over another's) would otherwise be compared under the name it was copied to."""
    named = paths.parse(paths.READOUT, path)
    if named is None or not meta:  # not in the layout, or written before metadata existed
        return
    for key, field in NAMED.items():
        if str(meta.get(field)) != named[key]:
            raise manifest.ManifestError(
                f"{path}: records {field} {meta.get(field)!r}, its path says {named[key]!r} "
                "(a readout copied or moved under another's name)"
            )
    for col, want in (("arm", named["rarm"]), ("replicate", named["rep"])):
        if col in df and set(map(str, df[col].unique())) - {want}:
            raise manifest.ManifestError(
                f"{path}: rows of {col} {sorted(set(map(str, df[col].unique())))}, "
                f"its path says {want!r}"
            )


def structured(df: pd.DataFrame) -> pd.DataFrame:
    """A readout with its structural battery: as written, or, for a readout made before a column
    of it existed (answer_usable), recomputed by structure()."""
    return df if "answer_usable" in df.columns else structure(df)


def load(paths: list[str]) -> pd.DataFrame:
    frames = []
    for p in paths:
        df = read_readout(p)
        outcomes(df, "correct", str(p))  # name the readout file before its rows are pooled
        frames.append(structured(df))
    return pd.concat(frames, ignore_index=True)
