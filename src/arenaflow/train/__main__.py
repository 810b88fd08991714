"""CLI of arenaflow.train (see the package docstring)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from arenaflow.train import loop


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Train one arenaflow arm on DeepSpeed ZeRO.")
    ap.add_argument("--arm", required=True, help="arm id")
    ap.add_argument("--params-json", required=True, help="the arm's merged hyperparameters as JSON")
    ap.add_argument(
        "--engine-json",
        default=None,
        help="the arm's engine settings as JSON (config `engine:`; default: the schema's)",
    )
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="optimizer steps between resumable checkpoints (overrides --params-json's)",
    )
    ap.add_argument(
        "--corpus",
        required=True,
        nargs="+",
        help="corpora/{corpus} (its manifest must verify); a mixture: one per source, in order",
    )
    ap.add_argument(
        "--mix-json",
        default=None,
        help="a mixture, {corpus id: row count or 'all'} in the order of --corpus",
    )
    ap.add_argument("--arm-file", default="the arm", help="the arm's file, named in errors")
    ap.add_argument(
        "--corpus-id", default=None, help="corpus id for the evidence (default: dir name)"
    )
    ap.add_argument("--init", required=True, help="'base' or the init arm's runs/{arm}/final")
    ap.add_argument("--base-model", required=True, help="base model directory")
    ap.add_argument(
        "--chat-template",
        default=None,
        help="base.chat_template: own, chatml or a .jinja file (default: the tokenizer's as saved)",
    )
    ap.add_argument("--base-name", default=None, help="base model name for the evidence")
    ap.add_argument(
        "--base-revision", default=None, help="base revision (default: sha256 of weights)"
    )
    ap.add_argument("--out", required=True, help="runs/{arm}/final")
    ap.add_argument(
        "--tracking-json",
        default=None,
        help="config `tracking:` as resolved, JSON (arenaflow.tracking; default: no tracker)",
    )
    loop.run(ap.parse_args(argv))


if __name__ == "__main__":
    main()
    # The run is finished: every rank met the final barrier and rank 0 renamed the outputs into
    # place. The process groups' native threads (gloo's tcp loop and work threads) outlive
    # destroy_process_group, since DeepSpeed keeps references to its groups, and tearing them
    # down with the interpreter now and then aborted a rank ("terminate called without an active
    # exception", SIGABRT; twice in CI). torchrun then reports the finished run as failed and
    # Snakemake deletes its outputs. So the process ends without native teardown.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
