"""Load, validate and resolve arenaflow's config before any job runs.

config.yaml is validated against workflow/schemas/config.schema.yaml, each arms_dir/<arm>.yaml
against arm.schema.yaml (additionalProperties: false everywhere, IDs that cannot escape a
path). Then every name is resolved: a corpus's pool and policy, an arm's init and corpus, a
round's arms, a bundle's arm or round, a judged read's suite, regime and arms. An unknown name
or a lineage cycle raises ConfigError with the file and key at fault.

    python -m arenaflow.config config/config.yaml   # validate and print the lineage of each arm
"""

from __future__ import annotations

import argparse
import copy
import functools
import graphlib
import json
import math
import os
from pathlib import Path

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from arenaflow.pools import build as afpools
from arenaflow.rounds import bar as afbar
from arenaflow.rounds import continual

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO_ROOT / "workflow" / "schemas"
BASE, REFERENCE = "base", "reference"
TRAINED, MERGE, DOSE = "trained", "merge", "dose"  # the kinds of arm (arm.schema.yaml)
NOMINEE = continual.NOMINEE  # a round's nominee, as an arm (arenaflow.rounds.continual)
RESERVED = {BASE, REFERENCE}
# objectives that train on pairs (format: pairs): each row runs its chosen and rejected sides
PREFERENCE_OBJECTIVES = ("dpo", "simpo")


class ConfigError(ValueError):
    pass


def _schemas(schema_dir: Path) -> tuple[dict, dict, Registry]:
    loaded = {
        name: yaml.safe_load((schema_dir / name).read_text())
        for name in ("config.schema.yaml", "arm.schema.yaml")
    }
    registry = Registry().with_resources(
        (name, Resource.from_contents(s, default_specification=DRAFT202012))
        for name, s in loaded.items()
    )
    return loaded["config.schema.yaml"], loaded["arm.schema.yaml"], registry


def _validate(data, schema: dict, registry: Registry, where: str) -> None:
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        key = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"{where}: key '{key}': {e.message}{more}")


def _defaults(schema: dict, data: dict, defs: dict | None = None) -> dict:
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
    "mc_guard": ("mc_guards", "additionalProperties"),
    "budget": ("budget",),
    "estimate": ("budget", "properties", "estimate"),
}


def _part(schema: dict, part: str) -> dict:
    node = schema["properties"]
    for key in _PARTS[part]:
        node = node[key]
    return node


@functools.cache
def _schema_defaults(schema_dir: Path, part: str) -> dict:
    schema = yaml.safe_load((schema_dir / "config.schema.yaml").read_text())
    return _defaults(_part(schema, part), {}, schema["$defs"])


def schema_defaults(part: str, schema_dir: Path = SCHEMA_DIR) -> dict:
    """{key: default} of one object of config.schema.yaml ('pool', 'corpus', 'suite', 'regime',
    'noise', 'judged', 'budget', 'estimate'): the one place each of those defaults lives. Config
    resolution fills them, except where the object is a rule param as written (a pool, a bar
    clause's noise, a regime's decoding, a corpus's engine: a filled key would change the param
    and rerun every job made with it); what reads those objects takes a missing key from here."""
    return copy.deepcopy(_schema_defaults(Path(schema_dir), part))


@functools.cache
def _hyper_defaults(schema_dir: Path) -> dict:
    arm_schema = yaml.safe_load((schema_dir / "arm.schema.yaml").read_text())
    return _defaults(arm_schema["$defs"]["hyper"], {})


def hyper_defaults(schema_dir: Path = SCHEMA_DIR) -> dict:
    """The `default` of every hyper key in arm.schema.yaml: the one place a hyperparameter's
    default lives. Config resolution, the trainer (arenaflow.train.loop) and the GPU-minute
    estimate (arenaflow.budget.ledger) read a key missing from an arm's hyper here. Resolution does
    not
    write them into the resolved hyper: that hyper is the train rule's param, and adding keys
    to it would rerun every trained arm."""
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


def load_arms(arms_dir: Path, arm_schema: dict, registry: Registry) -> tuple[dict, dict]:
    """Return ({arm: raw arm config}, {arm: file path}) for every arms_dir/<arm>.yaml; a dose
    file with a list of alphas gives one arm per alpha (dose_ids)."""
    if not arms_dir.is_dir():
        raise ConfigError(f"arms_dir {arms_dir}: not a directory")
    arms, files = {}, {}
    for path in sorted(arms_dir.glob("*.yaml")):
        arm = path.stem
        _validate(
            {"id": arm},
            {"properties": {"id": {"pattern": "^[A-Za-z0-9][A-Za-z0-9_-]*$"}}},
            registry,
            f"{path}: file name",
        )
        if arm in RESERVED:
            raise ConfigError(f"{path}: '{arm}' is reserved and cannot name an arm")
        data = load_yaml(path) or {}
        _validate(data, arm_schema, registry, str(path))
        _check_kind(data, path)
        for aid, adata in dose_ids(arm, _defaults(arm_schema, data)).items():
            if aid in arms:
                raise ConfigError(f"{path}: arm id {aid!r} is also {files[aid]}'s")
            arms[aid], files[aid] = adata, path
    return arms, files


def template_arms(
    arms_dir: Path, arm_schema: dict, registry: Registry
) -> dict[str, tuple[dict, Path]]:
    """{stem: (data, path)} of a round template's arm files: trained arms without init and
    corpus (the template gives both), e.g. `hyper: {lr: 5.0e-4}`."""
    if not arms_dir.is_dir():
        raise ConfigError(f"continual arms_dir {arms_dir}: not a directory")
    out = {}
    for path in sorted(arms_dir.glob("*.yaml")):
        data = load_yaml(path) or {}
        _validate(data, arm_schema, registry, str(path))
        extra = sorted(set(data) - {"description", "hyper", "priority"})
        if extra:
            raise ConfigError(
                f"{path}: key '{extra[0]}': a round template's arm sets only description, "
                "hyper and priority (the template gives its init and corpus)"
            )
        out[path.stem] = (_defaults(arm_schema, data), path)
    return out


def arm_kind(data: dict) -> str:
    """TRAINED, MERGE or DOSE: what an arm file (already checked by _check_kind) declares;
    NOMINEE for a round's nominee (arenaflow.rounds.continual)."""
    return (
        NOMINEE
        if NOMINEE in data
        else DOSE
        if "dose" in data
        else MERGE
        if "merge" in data
        else TRAINED
    )


def _check_kind(data: dict, path: Path) -> None:
    """An arm file is exactly one kind: trained (init and corpus), merge: or dose:."""
    present = [
        k
        for k, keys in (
            (TRAINED, ("init", "corpus", "hyper")),
            (MERGE, ("merge",)),
            (DOSE, ("dose",)),
        )
        if any(k2 in data for k2 in keys)
    ]
    if len(present) != 1:
        raise ConfigError(
            f"{path}: an arm file is exactly one of: a trained arm (keys init and corpus), "
            f"a merge (key merge) or a dose line (key dose); it has {present or 'none of them'}"
        )
    missing = [k for k in ("init", "corpus") if k not in data]
    if present == [TRAINED] and missing:
        raise ConfigError(f"{path}: key '{missing[0]}': a trained arm needs init and corpus")


def alpha_id(alpha: float) -> str:
    """0.5 -> 'a0p5', 2 -> 'a2', -0.5 -> 'am0p5': an arm id may hold neither '.' nor a leading
    '-'."""
    return "a" + f"{alpha:g}".replace("-", "m").replace(".", "p")


def dose_ids(stem: str, data: dict) -> dict[str, dict]:
    """{arm id: arm data}: a dose with a list of alphas is one arm per alpha, <stem>-a<alpha>."""
    alphas = data.get("dose", {}).get("alpha")
    if not isinstance(alphas, list):
        return {stem: data}
    out = {}
    for a in alphas:
        out[f"{stem}-{alpha_id(a)}"] = {**data, "dose": {**data["dose"], "alpha": a}}
    if len(out) != len(alphas):
        raise ConfigError(f"{stem}: key 'dose/alpha': {alphas} name the same arm twice")
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


def _resolve_paths(cfg: dict, root: Path, config_file: str, sources) -> None:
    """Relative paths in the config are relative to the workflow's root (where its Snakefile
    is), never to where arenaflow is installed: the base model, and imported pools' files (kept
    as written, with `root` beside them, so rows name the file as the config does)."""

    def where(*keys):
        return f"{key_line(sources, keys) or config_file}: key '{'/'.join(keys)}'"

    base = Path(cfg["base"]["path"])
    cfg["base"]["path"] = str(base if base.is_absolute() else root / base)
    if not Path(cfg["base"]["path"]).is_dir():
        raise ConfigError(
            f"{where('base', 'path')}: no model directory {cfg['base']['path']} (a relative "
            f"path is relative to the workflow's root, {root})"
        )
    for pid, pool in cfg["pools"].items():
        if "file" not in pool:
            continue
        if not Path(pool["file"]).is_absolute():
            pool["root"] = str(root)
        path = Path(pool.get("root", "")) / pool["file"]
        if not path.is_file():
            raise ConfigError(
                f"{where('pools', pid, 'file')}: no such file {path} (a relative path is "
                f"relative to the workflow's root, {root})"
            )


def resolve(
    config: dict,
    repo_root: Path = REPO_ROOT,
    schema_dir: Path = SCHEMA_DIR,
    config_file: str = "config",
    sources=(),
) -> dict:
    """Validate `config` and its arm files; return a resolved copy with `arms` filled in:
    {arm: {init, corpus, priority, hyper (defaults merged), file, lineage}}. `sources`: the YAML
    files merged into `config`, to name the line of a key at fault."""
    schema, arm_schema, registry = _schemas(schema_dir)
    _validate(config, schema, registry, config_file)
    cfg = copy.deepcopy(config)
    root = Path(repo_root)
    _resolve_paths(cfg, root, config_file, sources)
    arms_dir = Path(cfg["arms_dir"])
    arms_dir = arms_dir if arms_dir.is_absolute() else root / arms_dir
    raw, files = load_arms(arms_dir, arm_schema, registry)
    if not raw:
        raise ConfigError(f"arms_dir {arms_dir}: no <arm>.yaml files")
    continual.expand(
        cfg,
        raw,
        files,
        lambda d: template_arms(continual.arm_dir(d, root), arm_schema, registry),
        config_file,
        ConfigError,
    )
    continual.resolve_refs(cfg, raw, files, config_file, ConfigError)
    _apply_overrides(cfg.get("arm_overrides", {}), raw, arms_dir, config_file)
    for key, msg in afpools.check_exclude(cfg["pools"]) + afpools.check_bands(cfg["pools"]):
        raise ConfigError(f"{config_file}: key '{key}': {msg}")
    _resolve_corpora(cfg, schema, raw, arms_dir, config_file)
    arms = _resolve_arms(cfg, raw, files, arms_dir)
    _resolve_evals(cfg, schema, config_file)
    known_arms = set(arms) | {BASE}
    _check_rounds(cfg, known_arms, config_file)
    _resolve_judged(cfg, schema, known_arms, root, config_file)
    _resolve_prompt_search(cfg, known_arms, config_file)
    _resolve_mc_guards(cfg, schema, set(arms), config_file)
    _resolve_budget(cfg, schema)
    _resolve_bundles(cfg, schema, arms, config_file)
    for sid, suite in cfg["evals"].items():  # after bundles: their serving defaults are filled
        for rid, regime in suite["regimes"].items():
            if "as_served" in regime:
                _as_served(regime, cfg, f"{config_file}: key 'evals/{sid}/regimes/{rid}/as_served'")
    cfg["arms"] = arms
    return cfg


def _apply_overrides(overrides: dict, raw: dict, arms_dir: Path, config_file: str) -> None:
    """Merge config's arm_overrides into the raw arms: a description replaces the file's, a
    hyper is merged over the file's (one model's LR sweep over arm files another model shares)."""
    for arm, over in overrides.items():
        where = f"{config_file}: key 'arm_overrides/{arm}"
        if arm not in raw:
            raise ConfigError(f"{where}': no arm {arm!r} in {arms_dir}; known: {sorted(raw)}")
        if "hyper" in over and arm_kind(raw[arm]) != TRAINED:
            raise ConfigError(
                f"{where}/hyper': {arm!r} is a {arm_kind(raw[arm])} arm, which trains nothing; "
                "only a trained arm has hyperparameters"
            )
        raw[arm] = merge(raw[arm], over)


def _resolve_corpora(cfg: dict, schema: dict, raw: dict, arms_dir: Path, config_file: str) -> None:
    """Each corpus names a known pool and a known policy; its defaults are filled, except
    `engine` (a $ref, not followed here): the corpus is the build_corpus param and its sampling
    keys the sample_candidates param, and filling it would resample every corpus made without it
    (arenaflow.candidates reads a missing engine from schema_defaults)."""
    corpus_props = _part(schema, "corpus")
    for cid, c in cfg["corpora"].items():
        where = f"{config_file}: key 'corpora/{cid}"
        if c["pool"] not in cfg["pools"]:
            raise ConfigError(
                f"{where}/pool': unknown pool {c['pool']!r}; known: {sorted(cfg['pools'])}"
            )
        if cfg["pools"][c["pool"]].get("turns", 1) > 1:  # a readout instrument only
            raise ConfigError(
                f"{where}/pool': pool {c['pool']!r} holds multi-turn conversations (turns > 1), "
                "which only readouts decode (arenaflow.instruct.multiturn); a corpus needs single "
                "prompts"
            )
        if c["policy"] not in RESERVED and c["policy"] not in raw:
            raise ConfigError(
                f"{where}/policy': {c['policy']!r} is not 'base', 'reference' "
                f"or an arm in {arms_dir}"
            )
        cfg["corpora"][cid] = _defaults(corpus_props, c)
        if "scaffold" in c:  # its marker's default filled: the verify rule passes it
            if c["policy"] == "reference":
                raise ConfigError(f"{where}/scaffold': policy 'reference' samples nothing")
            scaffold = corpus_props["properties"]["scaffold"]
            cfg["corpora"][cid]["scaffold"] = _defaults(scaffold, c["scaffold"])


def _resolve_arms(cfg: dict, raw: dict, files: dict, arms_dir: Path) -> dict:
    """{arm: {kind, init, corpus, description, priority, hyper, file, lineage}} (merges also
    `merge`, doses `dose`): an arm continues or merges known arms of its own method, and a trained
    arm trains on a corpus of the format its objective needs."""
    arms = {}
    for arm, data in raw.items():
        if arm_kind(data) == TRAINED:
            arms[arm] = _trained_arm(cfg, data, files[arm], raw, arms_dir)
        elif arm_kind(data) == NOMINEE:
            arms[arm] = continual.nominee_arm(data, cfg, raw, files[arm], ConfigError)
        else:
            arms[arm] = _merged_arm(data, files[arm], raw, arms_dir)
    for arm in arms:
        arms[arm]["lineage"] = _lineage(arm, arms, cfg["corpora"])
    # after the cycle check: a merge's or nominee's method is its parents'. In file order, so a
    # trained arm that cannot continue its init is named before a round that holds both
    for arm, a in arms.items():
        if a["kind"] != TRAINED:
            _method(arm, arms)
        elif a["init"] in arms and _method(a["init"], arms) != a["hyper"]["method"]:
            raise ConfigError(
                f"{a['file']}: key 'hyper/method': a {a['hyper']['method']} arm cannot continue "
                f"{a['init']!r}, a {arms[a['init']]['hyper']['method']} arm"
            )
    return arms


def _trained_arm(cfg: dict, data: dict, file: Path, raw: dict, arms_dir: Path) -> dict:
    where = f"{file}: key"
    if data["init"] != BASE and data["init"] not in raw:
        raise ConfigError(f"{where} 'init': {data['init']!r} is not 'base' or an arm in {arms_dir}")
    mix = _mixture(cfg, data["corpus"], where)
    hyper = merge(cfg["train_defaults"], data.get("hyper", {}))
    objective = with_hyper_defaults(hyper)["objective"]
    for cid in mix:
        fmt = cfg["corpora"][cid]["format"]
        if (objective in PREFERENCE_OBJECTIVES) != (fmt == "pairs"):
            raise ConfigError(
                f"{where} 'hyper/objective': {objective!r} cannot train on corpus {cid!r} "
                f"(format {fmt!r}); dpo/simpo need format 'pairs', sft needs 'sft'"
            )
    filled = with_hyper_defaults(hyper)
    if filled["grouped_lora"] and not filled["fused_lora"]:  # its members fall back to fused's
        raise ConfigError(
            f"{where} 'hyper/grouped_lora': true needs fused_lora true (train/lora_grouped "
            "groups lora_fused's linears)"
        )
    if filled["heldout_rows"] and objective != "sft":
        raise ConfigError(
            f"{where} 'hyper/heldout_rows': a held-out loss needs objective 'sft', "
            f"not {objective!r}"
        )
    return {
        "kind": TRAINED,
        "init": data["init"],
        "corpus": corpus_label(data["corpus"]),
        "mix": mix,
        "description": data.get("description", ""),
        "priority": data["priority"],
        "hyper": hyper,
        "file": str(file),
    }


def corpus_label(corpus) -> str:
    """An arm's corpus as one string: its id, or a mixture as lineage 003 wrote it
    ('iflensyn:33000,tulu3:all')."""
    if isinstance(corpus, str):
        return corpus
    return ",".join(f"{c}:{n}" for c, n in corpus.items())


def _mixture(cfg: dict, corpus, where: str) -> dict:
    """{corpus id: rows or 'all'} of an arm's `corpus` (an id is every row of that corpus).
    Each source is a known corpus, and a count is no larger than its pool (one row per prompt
    at most); the built corpus's own row count is checked by the training job."""
    mix = {corpus: "all"} if isinstance(corpus, str) else dict(corpus)
    for cid, count in mix.items():
        key = "corpus" if isinstance(corpus, str) else f"corpus/{cid}"
        if cid not in cfg["corpora"]:
            raise ConfigError(
                f"{where} '{key}': unknown corpus {cid!r}; known: {sorted(cfg['corpora'])}"
            )
        c = cfg["corpora"][cid]
        if len(mix) > 1 and c["format"] == "pairs":
            raise ConfigError(f"{where} '{key}': a mixture is of sft corpora; {cid!r} is pairs")
        most = cfg["pools"][c["pool"]].get("n")
        if count != "all" and most is not None and count > most:
            raise ConfigError(
                f"{where} '{key}': {count} rows asked, but corpus {cid!r} has at most {most} "
                f"(one row per prompt of pool {c['pool']!r})"
            )
    return mix


def _merged_arm(data: dict, file: Path, raw: dict, arms_dir: Path) -> dict:
    """A merge or dose arm: its parents with their weights (arenaflow.merge.build's one formula,
    base + sum_i w_i (arm_i - base)). Its `init`, the arm it is compared against in its lineage,
    is a dose's `from` or a merge's first arm. 'base' as a parent adds nothing and is dropped."""
    if arm_kind(data) == DOSE:
        d, key = data["dose"], "dose"
        if d["from"] == d["to"]:
            raise ConfigError(
                f"{file}: key 'dose/to': the line needs two arms; from and to are both {d['to']!r}"
            )
        weights, init = {d["from"]: 1.0 - d["alpha"], d["to"]: float(d["alpha"])}, d["from"]
        spec = {"dose": {"from": d["from"], "to": d["to"], "alpha": d["alpha"]}}
        keys = {d["from"]: "dose/from", d["to"]: "dose/to"}
    else:
        m, key = data["merge"], "merge"
        weights, init, spec = dict(m["of"]), next(iter(m["of"])), {}
        keys = {a: f"merge/of/{a}" for a in weights}
    for a, w in weights.items():
        if a != BASE and a not in raw:
            raise ConfigError(
                f"{file}: key '{keys[a]}': {a!r} is not 'base' or an arm in {arms_dir}"
            )
        if not math.isfinite(w):
            raise ConfigError(f"{file}: key '{keys[a]}': weight {w} is not a finite number")
    parents = {a: float(w) for a, w in weights.items() if a != BASE and w != 0}
    if not parents:
        raise ConfigError(
            f"{file}: key '{key}': nothing to merge: every arm is 'base' or has weight 0"
        )
    return {
        "kind": arm_kind(data),
        "init": init,
        "corpus": None,
        "mix": {},
        "description": data.get("description", ""),
        "priority": data["priority"],
        "merge": {"method": "linear", "weights": parents, "rank": data[key].get("rank")},
        **spec,
        "parents": list(parents),
        "hyper": {},
        "file": str(file),
    }


def _method(arm: str, arms: dict) -> str:
    """'lora' or 'full'; a merge's parents must agree (an adapter and full weights do not add)."""
    a = arms[arm]
    if "method" not in a["hyper"]:
        methods = {p: _method(p, arms) for p in a["parents"]}
        if len(set(methods.values())) > 1:
            raise ConfigError(
                f"{a['file']}: key '{a['kind']}': cannot {a['kind']} arms of different methods: "
                + ", ".join(f"{p} is {m}" for p, m in methods.items())
            )
        a["hyper"]["method"] = next(iter(methods.values()))
    return a["hyper"]["method"]


def _resolve_evals(cfg: dict, schema: dict, config_file: str) -> None:
    """Each suite reads a known pool, with its defaults filled (a regime's K is the suite's
    unless it sets its own; its decoding is not filled: decoding_of); no corpus trains on an
    eval pool."""
    eval_pools = {s["pool"] for s in cfg["evals"].values()}
    for sid, suite in cfg["evals"].items():
        if suite["pool"] not in cfg["pools"]:
            raise ConfigError(
                f"{config_file}: key 'evals/{sid}/pool': unknown pool {suite['pool']!r}"
            )
        suite = cfg["evals"][sid] = _defaults(_part(schema, "suite"), suite, schema["$defs"])
        for regime in suite["regimes"].values():
            regime.setdefault("replicates", suite["replicates"])
        _prompt_regimes(suite, f"{config_file}: key 'evals/{sid}/system_prompts'")
    for cid, c in cfg["corpora"].items():
        if c["pool"] in eval_pools:
            raise ConfigError(
                f"{config_file}: key 'corpora/{cid}/pool': {c['pool']!r} is an evaluation pool; "
                "training on it would contaminate every readout"
            )


PROMPT_NONE = "none"  # the search candidate with no system prompt


def _prompt_regimes(suite: dict, where: str) -> None:
    """A suite's `system_prompts` {k: text}: for each regime R, search regimes R-k (and R-none,
    no system prompt) under `prompt_regimes`, read out only for a prompt search (not by rounds or
    bundles' lineage comparisons; the budget charges them to the search's arm)."""
    prompts = suite.get("system_prompts")
    if not prompts:
        return
    if PROMPT_NONE in prompts:
        raise ConfigError(f"{where}: {PROMPT_NONE!r} is reserved (the search's no-prompt side)")
    suite["prompt_regimes"] = {}
    for rid, regime in suite["regimes"].items():
        for k, text in {PROMPT_NONE: "", **prompts}.items():
            if f"{rid}-{k}" in suite["regimes"]:
                raise ConfigError(f"{where}: search regime '{rid}-{k}' is also a declared regime")
            suite["prompt_regimes"][f"{rid}-{k}"] = {**regime, "system_prompt": text}


def regime(cfg: dict, suite: str, rid: str) -> dict:
    """A suite's regime: a declared one, or a prompt search's (_prompt_regimes)."""
    s = cfg["evals"][suite]
    return s["regimes"][rid] if rid in s["regimes"] else s["prompt_regimes"][rid]


def system_prompt_of(cfg: dict, suite: str, rid: str) -> str:
    """What a readout of this regime puts in the system turn ('' none): the regime's
    `system_prompt`, else the config's."""
    return regime(cfg, suite, rid).get("system_prompt", cfg["system_prompt"])


def _resolve_prompt_search(cfg: dict, known_arms: set, config_file: str) -> None:
    """Each prompt search reads a known arm under a suite's system_prompts, in a known regime."""
    for sid, ps in cfg.get("prompt_search", {}).items():
        where = f"{config_file}: key 'prompt_search/{sid}"
        s = cfg["evals"].get(ps["suite"])
        if s is None:
            raise ConfigError(f"{where}/suite': unknown suite {ps['suite']!r}")
        if not s.get("system_prompts"):
            raise ConfigError(f"{where}/suite': suite {ps['suite']!r} has no system_prompts")
        if ps["regime"] not in s["regimes"]:
            raise ConfigError(f"{where}/regime': suite {ps['suite']!r} has no {ps['regime']!r}")
        if ps["arm"] not in known_arms:
            raise ConfigError(f"{where}/arm': unknown arm {ps['arm']!r}")


def search_regimes(cfg: dict, search: str) -> list[str]:
    """The regimes prompt search `search` reads its arm under: R-none, then R-k for each of the
    suite's system_prompts (rule readout_search makes each; the budget charges them to the arm)."""
    ps = cfg["prompt_search"][search]
    keys = [PROMPT_NONE, *cfg["evals"][ps["suite"]]["system_prompts"]]
    return [f"{ps['regime']}-{k}" for k in keys]


def _resolve_mc_guards(cfg: dict, schema: dict, arms: set, config_file: str) -> None:
    """Each guard's defaults are filled; the arms it is run on are known arms."""
    for gid, g in cfg.get("mc_guards", {}).items():
        g = cfg["mc_guards"][gid] = _defaults(_part(schema, "mc_guard"), g)
        unknown = [] if g["arms"] == "all" else sorted(set(g["arms"]) - arms)
        if unknown:
            raise ConfigError(
                f"{config_file}: key 'mc_guards/{gid}/arms': unknown arm(s) {unknown}; "
                f"known: {sorted(arms)}"
            )


def _replicates(cfg: dict, suite: str, regime: str) -> int | None:
    return cfg["evals"].get(suite, {}).get("regimes", {}).get(regime, {}).get("replicates")


def _check_rounds(cfg: dict, known_arms: set, config_file: str) -> None:
    """Each round reads a known suite and regime, names known arms, and passes the bar's checks."""

    def replicates(suite, regime):
        return _replicates(cfg, suite, regime)

    def turns(suite):
        return cfg["pools"].get(cfg["evals"][suite]["pool"], {}).get("turns", 1)

    for rid, rnd in cfg["rounds"].items():
        where = f"{config_file}: key 'rounds/{rid}"
        _check_suite_regime(cfg, where, rnd["suite"], rnd["regime"])
        named = [
            ("incumbent", rnd["incumbent"]),
            ("control", rnd.get("control")),
            *((f"candidates/{i}", a) for i, a in enumerate(rnd["candidates"])),
        ]
        for key, a in named:
            if a is not None and a not in known_arms:
                raise ConfigError(f"{where}/{key}': unknown arm {a!r}")
        if rnd["incumbent"] in rnd["candidates"]:
            raise ConfigError(
                f"{where}/candidates': the incumbent {rnd['incumbent']!r} cannot be a candidate"
            )
        for key, msg in afbar.validate(rnd, replicates, known_arms, turns):
            raise ConfigError(f"{where}/{key}': {msg}")


def _check_suite_regime(cfg: dict, where: str, suite: str, regime: str) -> None:
    """A round's or judged read's suite exists and has the regime it names."""
    if suite not in cfg["evals"]:
        raise ConfigError(f"{where}/suite': unknown suite {suite!r}")
    if regime not in cfg["evals"][suite]["regimes"]:
        raise ConfigError(f"{where}/regime': suite {suite!r} has no regime {regime!r}")


def _resolve_judged(cfg: dict, schema: dict, known_arms: set, root: Path, config_file: str) -> None:
    """Each judged read compares two known arms on an existing replicate of a known regime; its
    defaults are filled."""
    for jid, j in cfg.setdefault("judged", {}).items():
        j = cfg["judged"][jid] = _defaults(_part(schema, "judged"), j)
        where = f"{config_file}: key 'judged/{jid}"
        _check_suite_regime(cfg, where, j["suite"], j["regime"])
        for key in ("a", "b"):
            if j[key] not in known_arms:
                raise ConfigError(f"{where}/{key}': unknown arm {j[key]!r}")
        if j["a"] == j["b"]:
            raise ConfigError(
                f"{where}/b': a judged read compares two arms; a and b are both {j['a']!r}"
            )
        n = _replicates(cfg, j["suite"], j["regime"])
        if j["replicate"] >= n:
            raise ConfigError(
                f"{where}/replicate': regime {j['regime']!r} has {n} "
                f"replicate(s), numbered from 0; got {j['replicate']}"
            )
        if "scores" in j:
            j["scores"] = str(root / j["scores"])  # an absolute path stays as it is


def _resolve_budget(cfg: dict, schema: dict) -> None:
    """The budget's defaults and its estimate's are filled (arenaflow.budget.ledger reads them)."""
    if "budget" in cfg:
        b = cfg["budget"] = _defaults(_part(schema, "budget"), cfg["budget"])
        b["estimate"] = _defaults(_part(schema, "estimate"), b.get("estimate", {}))


def _resolve_bundles(cfg: dict, schema: dict, arms: dict, config_file: str) -> None:
    """Each bundle names a known arm or round; its and its serving block's defaults are filled."""
    bundle_props = schema["properties"]["bundles"]["additionalProperties"]
    for bid, b in cfg["bundles"].items():
        where = f"{config_file}: key 'bundles/{bid}"
        if "arm" in b and b["arm"] not in arms:
            raise ConfigError(f"{where}/arm': unknown arm {b['arm']!r}")
        if "round" in b and b["round"] not in cfg["rounds"]:
            raise ConfigError(f"{where}/round': unknown round {b['round']!r}")
        b = _defaults(bundle_props, b)
        b["serving"] = _defaults(bundle_props["properties"]["serving"], b["serving"])
        b.setdefault("system_prompt", cfg["system_prompt"])
        if isinstance(b["system_prompt"], dict):  # {search: S}: the search's chosen prompt
            if b["system_prompt"]["search"] not in cfg.get("prompt_search", {}):
                raise ConfigError(
                    f"{where}/system_prompt/search': unknown prompt search "
                    f"{b['system_prompt']['search']!r}"
                )
        cfg["bundles"][bid] = b


def _as_served(regime: dict, cfg: dict, where: str) -> None:
    """Fill a regime's decoding from a bundle's serving block: what the bundle ships is what is
    read out (lineage 000 selected checkpoints greedily while serving at T=0.7:
    docs/lineages.md#000-greedy-vs-served-readouts)."""
    bid = regime["as_served"]
    if bid not in cfg["bundles"]:
        raise ConfigError(f"{where}: unknown bundle {bid!r}; known: {sorted(cfg['bundles'])}")
    decoding = [k for k in DECODING_KEYS if k in regime]
    if decoding:
        raise ConfigError(f"{where}: takes its decoding from bundle {bid!r}; remove {decoding}")
    s = cfg["bundles"][bid]["serving"]
    regime.update(
        temperature=s["temperature"] if s["do_sample"] else 0.0,
        top_p=s["top_p"],
        max_new_tokens=s["max_new_tokens"],
        repetition_penalty=s["repetition_penalty"],
    )


def _lineage(arm: str, arms: dict, corpora: dict) -> list[str]:
    """Arms `arm` depends on, nearest first, through init and its corpus's policy, or through a
    merge's arms. Raises ConfigError on a cycle."""
    order, stack = [], [(arm, (arm,))]
    seen = set()
    while stack:
        cur, path = stack.pop()
        for key, dep, via in _deps(arms[cur], corpora):
            if dep in RESERVED:
                continue
            if dep in path:
                # name the arm whose key closes the cycle, not the arm the walk started from
                cycle = " -> ".join((*path[path.index(dep) :], dep))
                raise ConfigError(
                    f"{arms[cur]['file']}: key '{key}': lineage cycle {cycle} "
                    f"(the last step is through {via})"
                )
            if dep not in seen:
                seen.add(dep)
                order.append(dep)
                stack.append((dep, (*path, dep)))
    # each arm before its own ancestors (a merge's parents share some): a chain reads nearest first
    graph = {a: [d for _k, d, _v in _deps(arms[a], corpora) if d in seen] for a in order}
    return list(reversed(list(graphlib.TopologicalSorter(graph).static_order())))


def _deps(a: dict, corpora: dict) -> list[tuple[str, str, str]]:
    """(key, arm, how) of each arm `a` is made from."""
    if a["kind"] == NOMINEE:
        return [(NOMINEE, p, f"round {a['round']}'s nominee") for p in a["parents"]]
    if a["kind"] != TRAINED:
        return [
            (a["kind"], p, f"{a['kind']} weight {w:g}") for p, w in a["merge"]["weights"].items()
        ]
    return [("init", a["init"], "init")] + [
        ("corpus", corpora[c]["policy"], f"the policy of corpus {c!r}") for c in a["mix"]
    ]


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
