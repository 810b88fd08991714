"""Load, validate and resolve arenaflow's config before any job runs.

config.yaml is validated against workflow/schemas/config.schema.yaml, each arms_dir/<arm>.yaml
against arm.schema.yaml (additionalProperties: false everywhere, IDs that cannot escape a
path). Then every name is resolved: a corpus's pool and policy, an arm's init and corpus, a
round's arms, a bundle's arm or round, a judged read's suite, regime and arms. An unknown name
or a lineage cycle raises ConfigError with the file and key at fault.

    python -m arenaflow.config config/config.yaml   # validate and print the lineage of each arm

arenaflow.config is the top of the import graph: it calls the stages' validators (pools, the
bar), and no stage module imports it (they read defaults from arenaflow.schema).
"""

from arenaflow.config.arms import alpha_id, arm_kind, corpus_label, dose_ids
from arenaflow.config.load import DEFAULT_CONFIG, files_label, key_line, load_configs, merged_over
from arenaflow.config.resolve import resolve
from arenaflow.schema import PROMPT_NONE, ConfigError, regime, search_regimes, system_prompt_of

__all__ = [
    "DEFAULT_CONFIG",
    "PROMPT_NONE",
    "ConfigError",
    "alpha_id",
    "arm_kind",
    "corpus_label",
    "dose_ids",
    "files_label",
    "key_line",
    "load_configs",
    "merged_over",
    "regime",
    "resolve",
    "search_regimes",
    "system_prompt_of",
]
