"""Change a registered round's bar: the one way, explicit and logged.

    python -m arenaflow.rounds.reregister --round r3 --reason "W-L of 3 was a typo" \\
        [--configfile my.yaml ...] [--config results_dir=/tmp/r]

The config files merge as Snakemake merges them (arenaflow.config.load_configs), and the round's
bar is read from the resolved config, so the bar registered is the one the workflow checks.
nominations/registry/{round}.jsonl (and the journal) get a "retired" event for the registration
in force and for any registration the registry lost (arenaflow.rounds.registry), then a
"registered" event for the config's bar, each with the reason, the user and the time;
nominations/{round}.bar.json is written again. The readouts judged must then be made after it
(`snakemake --forcerun readout_<suite>`): `nominate judge` refuses older ones.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path

from arenaflow import config as afconfig
from arenaflow import io
from arenaflow import schema as afschema
from arenaflow.config import cli
from arenaflow.rounds import nominate, registry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round", required=True, help="the round whose bar changes")
    ap.add_argument("--reason", required=True, help="why; recorded with the user and the time")
    cli.add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        cfg, files = cli.resolved(args)
    except afconfig.ConfigError as e:
        print(f"arenaflow config error: {e}", file=sys.stderr)
        return 1
    if args.round not in cfg["rounds"]:
        print(
            f"{afconfig.files_label(files)}: no round {args.round!r} under rounds", file=sys.stderr
        )
        return 1
    rnd = json.loads(afschema.stage_json(cfg["rounds"][args.round]))  # as the rules pass it
    noms = afschema.REPO_ROOT / cfg["results_dir"] / "nominations"
    try:
        new = registry.reregister(noms, args.round, rnd, args.reason, getpass.getuser())
        path = registry.registry_path(noms, args.round)
        out = Path(noms) / f"{args.round}.bar.json"
        io.write_json(out, nominate.record_registration(noms, path, args.round, rnd))
    except registry.RegistrationError as e:
        print(e, file=sys.stderr)
        return 1
    print(
        f"round {args.round}: bar sha256 {new['bar_sha256']} registered at "
        f"{new['registered_utc']} by {new['user']} ({path}); the readouts it judges must be "
        "made after it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
