"""A sharded readout's parts merged into the readout the unsharded job writes: the same rows.

    python -m arenaflow.evals.readout_merge --plan '[{"out": "readouts/math/B3/greedy.r0.parquet",
        ...}, ...]' --shards 3

Each shard of readout_<suite> (arenaflow.evals.readout --shard i-of-n) writes every readout of
the plan's part, readouts/{suite}/{arm}/{regime}.r{rep}.shards/{i}-of-{n}.parquet, from a
contiguous run of whole batches seeded as in the unsharded job (arenaflow.shards). The merge
concatenates the parts in shard order, skips the empty ones (a shard with no batches), and
writes the readout with the parts' metadata, their tokens and seconds summed. Its rows are the
unsharded readout's; only the metadata's created_utc and seconds differ, as between any two runs.
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from arenaflow import manifest, paths
from arenaflow.evals import readout_file

# what differs between the parts of one readout, and is summed or written afresh by the merge;
# decoded_by and chat_template too: an empty part, loading no model, cannot say how a decoder
# served it nor which template its tokenizer carried
LOADED = ("decoded_by", "chat_template")
PER_PART = ("tokens", "seconds", "created_utc", "code", *LOADED)


def read_part(path: str) -> tuple[pd.DataFrame, dict]:
    """A part's rows (page checksums verified) and metadata; ManifestError names a bad one."""
    try:
        df = pd.read_parquet(path, page_checksum_verification=True)
    except OSError as e:
        raise manifest.ManifestError(f"merging readouts: {path}: unreadable part: {e}") from None
    meta = readout_file.readout_meta(path)
    if not meta:
        raise manifest.ManifestError(f"merging readouts: {path}: no arenaflow metadata")
    return df, meta


def merge(out: str, shards: int) -> int:
    """Merge readout `out`'s `shards` parts into it; returns its rows. A part read with other
    settings (another decoding, seed, weights...) than shard 0's raises ManifestError naming
    it."""
    parts = paths.shards_of(out, shards)
    read = [read_part(p) for p in parts]
    same = {k: v for k, v in read[0][1].items() if k not in PER_PART}
    for p, (_, meta) in zip(parts, read):
        theirs = {k: v for k, v in meta.items() if k not in PER_PART}
        if theirs != same:
            bad = sorted(k for k in same.keys() | theirs.keys() if same.get(k) != theirs.get(k))
            raise manifest.ManifestError(
                f"merging readouts: {p}: its {', '.join(bad)} differ from {parts[0]}'s "
                "(a part of an older run of the shards)"
            )
    frames = [df for df, _ in read if len(df)]
    df = pd.concat(frames, ignore_index=True) if frames else read[0][0]
    tokens = sum(meta["tokens"] for _, meta in read)
    seconds = round(sum(meta["seconds"] for _, meta in read), 3)
    decoded = next((meta for df_, meta in read if len(df_)), read[0][1])
    totals = {"tokens": tokens, "seconds": seconds}
    totals |= {k: decoded[k] for k in LOADED if k in decoded}
    readout_file.write_readout(df, out, {**same, **totals})
    return len(df)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="readout_<suite>'s plan (JSON), as it was read")
    ap.add_argument("--shards", type=int, required=True, help="the shards it was read in")
    args = ap.parse_args(argv)
    for read in json.loads(args.plan):
        rows = merge(read["out"], args.shards)
        print(f"{rows} rows from {args.shards} shards -> {read['out']}")


if __name__ == "__main__":
    main()
