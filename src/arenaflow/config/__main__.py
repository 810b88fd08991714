"""Validate a config and print each arm's lineage.

python -m arenaflow.config config/config.yaml [more.yaml ...]"""

from __future__ import annotations

import argparse

from arenaflow.config.load import files_label, load_configs
from arenaflow.config.resolve import resolve
from arenaflow.schema import NOMINEE, TRAINED, ConfigError


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Validate a config and print each arm's lineage.")
    ap.add_argument(
        "configfile", nargs="+", help="config files, merged as snakemake --configfile merges them"
    )
    args = ap.parse_args(argv)
    try:
        raw, files = load_configs(args.configfile)
        cfg = resolve(raw, config_file=files_label(args.configfile), sources=files)
    except ConfigError as e:
        raise SystemExit(f"arenaflow config error: {e}") from None
    for arm, a in cfg["arms"].items():
        made = (
            f"init={a['init']} corpus={a['corpus']}"
            if a["kind"] == TRAINED
            else f"nominee of round {a['round']}: one of {', '.join(a['parents'])}"
            if a["kind"] == NOMINEE
            else f"{a['kind']} "
            + " + ".join(f"{w:g} x {p}" for p, w in a["merge"]["weights"].items())
        )
        print(f"{arm}: {made} lineage={' <- '.join([arm, *a['lineage']])}")


if __name__ == "__main__":
    main()
