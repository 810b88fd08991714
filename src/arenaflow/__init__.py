"""arenaflow: continual post-training of a pretrained LLM, one Snakemake stage per module."""

__version__ = "0.1.0"
