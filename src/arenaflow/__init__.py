"""arenaflow: continual post-training of a pretrained LLM, one Snakemake stage per module."""

__version__ = "0.1.0"

import os as _os

if _os.environ.get("ARENAFLOW_ZYGOTE"):  # `python -m arenaflow.<module>` runs in a fork server
    from arenaflow import zygote as _zygote

    _zygote.delegate(_os.environ["ARENAFLOW_ZYGOTE"])
