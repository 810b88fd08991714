"""The config as arenaflow's command-line tools read it: the files and overrides Snakemake
would be given (`--configfile`, `--config KEY=VALUE`), merged and resolved the same way."""

from __future__ import annotations

import argparse

from arenaflow.config.load import files_label, load_configs
from arenaflow.config.resolve import resolve


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--configfile",
        nargs="*",
        default=[],
        help="as snakemake's: merged over config/config.yaml unless one sets merge_over",
    )
    ap.add_argument(
        "--config",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="top-level overrides, as snakemake --config (e.g. results_dir=/tmp/r)",
    )


def resolved(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """(the resolved config, the files it was read from); ConfigError names file and key."""
    raw, files = load_configs(args.configfile, args.config)
    return resolve(raw, config_file=files_label(files), sources=files), files
