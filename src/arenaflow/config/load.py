"""Which config files make a run's config, merged as Snakemake merges them; where a key is set."""

from __future__ import annotations

from pathlib import Path

import yaml

from arenaflow.schema import REPO_ROOT, load_yaml, merge

DEFAULT_CONFIG = "config/config.yaml"  # what --configfile files are merged over (Snakefile)


def merged_over(config: dict) -> str | None:
    """The file, relative to the repo root, that the --configfile files (merged: `config`) are
    merged over: config/config.yaml, another file their `merge_over` names, or None where it is
    null (a standalone lineage config). One level: the named file's own merge_over is not
    followed."""
    return config.get("merge_over", DEFAULT_CONFIG)


def files_label(files) -> str:
    """How errors name a config merged from several files: 'a.yaml + b.yaml'."""
    return " + ".join(map(str, files))


def load_configs(configfiles, overrides=()) -> tuple[dict, list[str]]:
    """As Snakemake builds `config`: the files merged in order over the file they name as
    merge_over (config/config.yaml by default), then key=value overrides as --config. Returns
    the config and the files read, in order."""
    cfg: dict = {}
    for f in configfiles:
        cfg = merge(cfg, load_yaml(f) or {})
    for kv in overrides:
        key, _, value = kv.partition("=")
        cfg[key] = yaml.safe_load(value)
    under = merged_over(cfg)
    files = [str(f) for f in configfiles]
    if under is not None:
        cfg = merge(load_yaml(REPO_ROOT / under) or {}, cfg)
        files.insert(0, str(REPO_ROOT / under))
    return cfg, files


def key_line(sources, keys: tuple[str, ...]) -> str | None:
    """'file:line' where the last of the YAML files `sources` that sets `keys` sets it."""
    for src in reversed([str(s) for s in sources]):
        try:
            node = yaml.compose(Path(src).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        for k in keys:
            items = node.value if isinstance(node, yaml.MappingNode) else []
            node = next((v for kn, v in items if kn.value == k), None)
            if node is None:
                break
        if node is not None:
            return f"{src}:{node.start_mark.line + 1}"
    return None
