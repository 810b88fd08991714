"""The config's schemas, their defaults, YAML loading and ConfigError: the leaf every stage reads.

workflow/schemas/config.schema.yaml and arm.schema.yaml hold every key with its type, default and
meaning (docs/configuration.md is generated from them). Stage modules take defaults from here and
never import arenaflow.config, which resolves a whole config and calls their validators.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import re
from pathlib import Path

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO_ROOT / "workflow" / "schemas"


BASE, REFERENCE = "base", "reference"
TRAINED, MERGE, DOSE = "trained", "merge", "dose"  # the kinds of arm (arm.schema.yaml)
NOMINEE = "nominee"  # a round's nominee as an arm (arenaflow.rounds.continual)
RESERVED = {BASE, REFERENCE}
# objectives that train on pairs (format: pairs): each row runs its chosen and rejected sides
PREFERENCE_OBJECTIVES = ("dpo", "simpo")


class ConfigError(ValueError):
    pass


def schemas(schema_dir: Path) -> tuple[dict, dict, Registry]:
    loaded = {
        name: yaml.safe_load((schema_dir / name).read_text())
        for name in ("config.schema.yaml", "arm.schema.yaml")
    }
    registry = Registry().with_resources(
        (name, Resource.from_contents(s, default_specification=DRAFT202012))
        for name, s in loaded.items()
    )
    return loaded["config.schema.yaml"], loaded["arm.schema.yaml"], registry


def non_finite(data, path: tuple = ()) -> tuple | None:
    """The path of the first NaN or infinite number in `data` (YAML's .nan and .inf are numbers
    to JSON Schema, and nothing downstream can use them), or None."""
    if isinstance(data, float) and not math.isfinite(data):
        return path
    items = (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list)
        else ()
    )
    for k, v in items:
        found = non_finite(v, (*path, k))
        if found is not None:
            return found
    return None


def validate(data, schema: dict, registry: Registry, where: str, at: tuple = ()) -> None:
    """Raise ConfigError naming `where` and the key of the first error; `at`: the keys of `data`
    inside the file (a part of it validated on its own)."""
    bad = non_finite(data)
    if bad is not None:
        key = "/".join(map(str, (*at, *bad)))
        raise ConfigError(f"{where}: key '{key}': {dig(data, bad)} is not a finite number")
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        key = "/".join(str(p) for p in (*at, *e.absolute_path)) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"{where}: key '{key}': {e.message}{more}")


def dig(data, path: tuple):
    for k in path:
        data = data[k]
    return data


def filled(schema: dict, data: dict, defs: dict | None = None) -> dict:
    """Fill `default`s of a flat object schema into a copy of data; with `defs` (the schema's
    $defs), a key that is a $ref to one of them takes its default too."""
    out = dict(data)
    for key, prop in schema.get("properties", {}).items():
        ref = prop.get("$ref", "")
        if defs is not None and "default" not in prop and ref.startswith("#/$defs/"):
            prop = defs[ref.removeprefix("#/$defs/")]
        if "default" in prop and key not in out:
            out[key] = copy.deepcopy(prop["default"])
    return out


# Where each object of config.schema.yaml with `default`s sits in it (schema_defaults).
_PARTS = {
    "pool": ("pools", "additionalProperties"),
    "corpus": ("corpora", "additionalProperties"),
    "suite": ("evals", "additionalProperties"),
    "regime": ("evals", "additionalProperties", "properties", "regimes", "additionalProperties"),
    "noise": (
        "rounds",
        "additionalProperties",
        "properties",
        "bar",
        "items",
        "properties",
        "noise",
    ),
    "judged": ("judged", "additionalProperties"),
    "bundle": ("bundles", "additionalProperties"),
    "mc_guard": ("mc_guards", "additionalProperties"),
    "budget": ("budget",),
    "promotion": ("promotion",),
    "estimate": ("budget", "properties", "estimate"),
    "engine": ("$defs", "engine"),  # a path from $defs starts at the schema's root
    "tracking": ("tracking",),
    "tensorboard": ("tracking", "properties", "tensorboard"),
    "mlflow": ("tracking", "properties", "mlflow"),
    "wandb": ("tracking", "properties", "wandb"),
}


def schema_part(schema: dict, part: str) -> dict:
    node = schema if _PARTS[part][0] == "$defs" else schema["properties"]
    for key in _PARTS[part]:
        node = node[key]
    return node


@functools.cache
def _schema_defaults(schema_dir: Path, part: str) -> dict:
    schema = yaml.safe_load((schema_dir / "config.schema.yaml").read_text())
    return filled(schema_part(schema, part), {}, schema["$defs"])


def schema_defaults(part: str, schema_dir: Path = SCHEMA_DIR) -> dict:
    """{key: default} of one object of config.schema.yaml ('pool', 'corpus', 'suite', 'regime',
    'noise', 'judged', 'bundle', 'budget', 'estimate', 'engine', 'tracking', 'tensorboard',
    'mlflow', 'wandb'): the one place each of those defaults lives. Config resolution fills them,
    except where the object is a rule param as written (a pool, a bar clause's noise, a regime's
    decoding: a filled key would change the param and rerun every job made with it); what reads
    those objects takes a missing key from here."""
    return copy.deepcopy(_schema_defaults(Path(schema_dir), part))


@functools.cache
def _hyper_defaults(schema_dir: Path) -> dict:
    arm_schema = yaml.safe_load((schema_dir / "arm.schema.yaml").read_text())
    return filled(arm_schema["$defs"]["hyper"], {})


def hyper_defaults(schema_dir: Path = SCHEMA_DIR) -> dict:
    """The `default` of every hyper key in arm.schema.yaml: the one place a hyperparameter's
    default lives. Config resolution fills an arm's hyper from here, whole (arenaflow.config);
    the trainer fills only what a hand-run job was not given, and the GPU-minute estimate
    (arenaflow.budget.cost) what a hand-made arm lacks."""
    return copy.deepcopy(_hyper_defaults(Path(schema_dir)))


def with_hyper_defaults(hyper: dict, schema_dir: Path = SCHEMA_DIR) -> dict:
    """`hyper` with the schema's defaults under it (what a training run of it uses)."""
    return merge(hyper_defaults(schema_dir), hyper)


def merge(base: dict, over: dict) -> dict:
    """Deep merge: dicts merge, everything else (lists included) is replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = (
            merge(out[k], v)
            if isinstance(v, dict) and isinstance(out.get(k), dict)
            else copy.deepcopy(v)
        )
    return out


def load_yaml(path: str | os.PathLike):
    """A YAML file's content; a syntax error or a byte that is not UTF-8 raises ConfigError
    naming path:line:column (yaml and Snakemake name only '<unicode string>' or no line)."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(
            f"{path}:{line}:{col}: not valid UTF-8 (byte 0x{data[e.start]:02x})"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark, ctx = e.problem_mark or e.context_mark, e.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = e.problem or e.context
        if e.context and e.problem and ctx:  # e.g. an unclosed bracket: where it was opened
            what += f" ({e.context} at line {ctx.line + 1}, column {ctx.column + 1})"
        raise ConfigError(f"{where}: YAML syntax error: {what}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: YAML error: {e}") from None


def stage_json(section: dict) -> str:
    """A stage's config as sorted JSON: Snakemake's params trigger sees any change."""
    return json.dumps(section, sort_keys=True, separators=(",", ":"))


# What a training job asks of the scheduler and how often it saves: never what it computes, so
# never a rule param (a change would rerun the arm and every descendant). rules/train.smk passes
# them as resources instead.
RUN_KEYS = ("runtime_min", "mem_mb", "checkpoint_every")


# A readout regime's decoding keys: the readout rule's param holds those a regime sets
# (rules/common.smk decoding()), and the readout takes the others from config.schema.yaml.
DECODING_KEYS = ("temperature", "top_p", "max_new_tokens", "repetition_penalty")


def decoding_of(regime: dict, schema_dir: Path = SCHEMA_DIR) -> dict:
    """What a regime decodes with: each decoding key as the regime sets it, else the schema's
    default (resolution does not fill them: see DECODING_KEYS)."""
    return {
        **schema_defaults("regime", schema_dir),
        **{k: regime[k] for k in DECODING_KEYS if k in regime},
    }


# The corpus keys that decide the samples; the rest (select, coverage, min_chars, format,
# decontaminate) only decide which samples a corpus keeps, and must not resample on the GPU.
SAMPLING_KEYS = (
    "pool",
    "policy",
    "k",
    "temperature",
    "top_p",
    "max_new_tokens",
    "seed",
    "batch_size",
    "engine",
    "scaffold",
)


def result_hyper(hyper: dict) -> str:
    """An arm's hyperparameters that change its weights, as a rule param."""
    return stage_json({k: v for k, v in hyper.items() if k not in RUN_KEYS})


def sampling_params(corpus: dict) -> str:
    """A corpus's sampling keys, as the sample_candidates param."""
    return stage_json({k: corpus[k] for k in SAMPLING_KEYS if k in corpus})


def nominee_id(rnd: str) -> str:
    return f"{rnd}-nominee"


def round_ids(after: str, n: int, where: str, error) -> list[str]:
    """r3, 2 -> [r4, r5]: the template's rounds continue the number ending `after`."""
    m = re.fullmatch(r"(.*?)(\d+)", after)
    if not m:
        raise error(f"{where}/after': round id {after!r} does not end in a number to count on from")
    prefix, k = m.group(1), int(m.group(2))
    return [f"{prefix}{k + i}" for i in range(1, n + 1)]


PROMPT_NONE = "none"  # the search candidate with no system prompt


def regime(cfg: dict, suite: str, rid: str) -> dict:
    """A suite's regime: a declared one, or a prompt search's (_prompt_regimes)."""
    s = cfg["evals"][suite]
    return s["regimes"][rid] if rid in s["regimes"] else s["prompt_regimes"][rid]


def system_prompt_of(cfg: dict, suite: str, rid: str) -> str:
    """What a readout of this regime puts in the system turn ('' none): the regime's
    `system_prompt`, else the config's."""
    return regime(cfg, suite, rid).get("system_prompt", cfg["system_prompt"])


def search_regimes(cfg: dict, search: str) -> list[str]:
    """The regimes prompt search `search` reads its arm under: R-none, then R-k for each of the
    suite's system_prompts (rule readout_search makes each; the budget charges them to the arm)."""
    ps = cfg["prompt_search"][search]
    keys = [PROMPT_NONE, *cfg["evals"][ps["suite"]]["system_prompts"]]
    return [f"{ps['regime']}-{k}" for k in keys]
