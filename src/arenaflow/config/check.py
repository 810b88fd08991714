"""Outputs made with settings the config no longer has.

    python -m arenaflow.config.check [--configfile F ...] [--config KEY=VALUE ...]

Snakemake reruns a job whose params changed, but `snakemake --touch`, a results directory
copied from elsewhere or a job run by hand can leave an output made with other settings looking
current. This compares what each output records with the config as resolved: a trained arm's
hyperparameters and engine settings (its run's training_evidence.json), a corpus's section of
the config (its manifest's params), a readout's decoding and system turn (its metadata). Each
mismatch is printed naming the file and the key, and the command exits 1; `snakemake --forcerun
<rule>` (or deleting the output) makes it again. Missing outputs are not its business.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from arenaflow import io, paths
from arenaflow.config import cli
from arenaflow.dag import stages
from arenaflow.schema import REPO_ROOT, TRAINED, ConfigError, system_prompt_of


def differ(where: str, recorded: dict, wanted: dict) -> Iterator[str]:
    """'where: key recorded X, the config has Y' for each key of `wanted` recorded otherwise."""
    if not isinstance(recorded, dict):  # written before these settings were recorded
        yield f"{where}: recorded {recorded!r}, not the settings the config has"
        return
    for key, want in wanted.items():
        have = recorded.get(key)
        if json.dumps(have, sort_keys=True) != json.dumps(want, sort_keys=True):
            yield f"{where}: {key} recorded {have!r}, the config has {want!r}"


def stale_runs(cfg: dict, results: Path) -> Iterator[str]:
    for arm, a in cfg["arms"].items():
        evidence = results / paths.run(arm) / "training_evidence.json"
        if a["kind"] != TRAINED or not evidence.exists():
            continue
        ev = io.read_json(evidence)
        yield from differ(f"{evidence} hyperparameters", ev.get("hyperparameters", {}),
                          json.loads(a["params_json"]))  # fmt: skip
        yield from differ(f"{evidence} engine", ev.get("engine", {}), a["engine"])


def stale_corpora(cfg: dict, results: Path) -> Iterator[str]:
    for corpus, section in cfg["corpora"].items():
        record = results / paths.corpus_manifest(corpus)
        if record.exists():
            wanted = {**section, "system_prompt": cfg["system_prompt"]}
            yield from differ(str(record), io.read_json(record).get("params", {}), wanted)


def stale_readouts(cfg: dict, results: Path) -> Iterator[str]:
    from arenaflow.evals.readout_file import readout_meta  # pyarrow: only here

    for suite in cfg["evals"]:
        reads = set(stages.suite_reads(cfg, suite))
        for path in sorted((results / "readouts" / suite).glob("*/*.parquet")):
            named = paths.parse(paths.READOUT, path)
            if named is None or (named["regime"], int(named["rep"])) not in reads:
                continue  # a regime or replicate no longer asked for: nothing reads it
            meta = readout_meta(path)
            wanted = {
                "decoding": stages.regime_decoding(cfg, suite, named["regime"]),
                "system_prompt": system_prompt_of(cfg, suite, named["regime"]),
            }
            yield from differ(str(path), meta, wanted)
            yield from differ(
                f"{path} engine", meta.get("engine", {}), cfg["evals"][suite]["engine"]
            )


def stale(cfg: dict, results: Path) -> list[str]:
    return [*stale_runs(cfg, results), *stale_corpora(cfg, results), *stale_readouts(cfg, results)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        cfg, _ = cli.resolved(args)
    except ConfigError as e:
        raise SystemExit(f"arenaflow config error: {e}") from None
    results = REPO_ROOT / cfg["results_dir"]
    found = stale(cfg, results)
    for line in found:
        print(line)
    print(f"{len(found)} recorded setting(s) differ from the config under {results}")
    raise SystemExit(1 if found else 0)


if __name__ == "__main__":
    main()
