"""resolve(): a config validated and every name, default and derived value filled, once.

The order matters: paths first, then round templates and nominee references become plain config
(arenaflow.config.continual), arm overrides, pools' checks, corpora, arms (arenaflow.config.arms),
suites, rounds (each bar resolved), judged reads, prompt searches, guards, the budget, bundles;
regimes read out as served last, once the bundles' serving blocks are filled. Every job's
params and engine settings come out of it whole: a job fills nothing resolution filled.
"""

from __future__ import annotations

import copy
from pathlib import Path

from arenaflow import bases, chatformat, tracking
from arenaflow.config import continual
from arenaflow.config.arms import _apply_overrides, _resolve_arms, load_arms, template_arms
from arenaflow.config.load import key_line
from arenaflow.pools import exclude as afexclude
from arenaflow.pools import imported as afimported
from arenaflow.rounds import bar as afbar
from arenaflow.rounds import gate as afgate
from arenaflow.schema import (
    BASE,
    DECODING_KEYS,
    PROMPT_NONE,
    REPO_ROOT,
    RESERVED,
    SCHEMA_DIR,
    ConfigError,
    filled,
    schema_defaults,
    schema_part,
    schemas,
    validate,
)


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
    if why := bases.not_a_model(cfg["base"]["path"]):
        raise ConfigError(f"{where('base', 'path')}: {why}")
    _resolve_chat_template(cfg["base"], root, where("base", "chat_template"))
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


def _resolve_chat_template(base: dict, root: Path, where: str) -> None:
    """base.chat_template: a file's path made absolute; `own` refused before any job when the
    base ships no template, naming the base directory."""
    spec = base.setdefault("chat_template", chatformat.OWN)
    if spec not in (chatformat.OWN, chatformat.CHATML):
        path = Path(spec) if Path(spec).is_absolute() else root / spec
        if not path.is_file():
            raise ConfigError(f"{where}: no chat template file {path} (relative to {root})")
        base["chat_template"] = str(path)
    elif spec == chatformat.OWN and chatformat.own_template(base["path"]) is None:
        raise ConfigError(
            f"{where}: base {base['path']} has no chat template of its own (no "
            "chat_template.jinja, no chat_template in tokenizer_config.json); set "
            "base.chat_template to 'chatml' or to a .jinja file"
        )


def _check_system_turn(cfg: dict, sources, config_file: str) -> None:
    """A system prompt under a template that refuses a system turn (Mistral v0.1, Gemma) is
    refused before any job, naming the base and the template, not by the first job to render."""
    spec = cfg["base"]["chat_template"]
    if spec == chatformat.CHATML:
        return
    prompts = {("system_prompt",): cfg["system_prompt"]}
    for sid, suite in cfg["evals"].items():
        for k, text in (suite.get("system_prompts") or {}).items():
            prompts[("evals", sid, "system_prompts", k)] = text
    keys = next((k for k, text in prompts.items() if text), None)
    if keys is None:
        return
    template = chatformat.template_text(spec, cfg["base"]["path"], chatformat.CHATML)
    if why := chatformat.system_turn_refusal(template):
        raise ConfigError(
            f"{key_line(sources, keys) or config_file}: key '{'/'.join(keys)}': base "
            f"{cfg['base']['path']} with chat template {spec!r} refuses a system turn "
            f"({why!r}), and this system prompt is {prompts[keys]!r}; set "
            'system_prompt: "" (and no suite system_prompts) or another base.chat_template '
            "('chatml' or a .jinja file that takes a system turn)"
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
    schema, arm_schema, registry = schemas(schema_dir)
    validate(config, schema, registry, config_file)
    cfg = copy.deepcopy(config)
    root = Path(repo_root)
    _resolve_paths(cfg, root, config_file, sources)
    cfg["engine"] = {**schema_defaults("engine"), **cfg.get("engine", {})}
    results = Path(cfg["results_dir"])
    cfg["tracking"] = tracking.settings(
        cfg.get("tracking"), results if results.is_absolute() else root / results, config_file
    )
    arms_dir = Path(cfg["arms_dir"])
    arms_dir = arms_dir if arms_dir.is_absolute() else root / arms_dir
    raw, files = load_arms(arms_dir, arm_schema, registry)
    if not raw:
        raise ConfigError(f"arms_dir {arms_dir}: no <arm>.yaml files")
    _check_template_corpus(cfg, registry, config_file)
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
    for key, msg in afexclude.check_exclude(cfg["pools"]) + afimported.check_bands(cfg["pools"]):
        raise ConfigError(f"{config_file}: key '{key}': {msg}")
    _resolve_corpora(cfg, schema, raw, arms_dir, config_file)
    arms = _resolve_arms(cfg, raw, files, arms_dir)
    _resolve_evals(cfg, schema, config_file)
    _check_system_turn(cfg, sources, config_file)
    known_arms = set(arms) | {BASE}
    cfg["promotion"] = filled(schema_part(schema, "promotion"), cfg.get("promotion", {}))
    _check_rounds(cfg, known_arms, config_file)
    _resolve_judged(cfg, schema, known_arms, root, config_file)
    _resolve_prompt_search(cfg, known_arms, config_file)
    _resolve_mc_guards(cfg, schema, set(arms), config_file)
    _resolve_budget(cfg, schema)
    _resolve_bundles(cfg, schema, arms, config_file)
    _check_lora_targets(cfg["base"]["path"], arms)
    for sid, suite in cfg["evals"].items():  # after bundles: their serving defaults are filled
        for rid, regime in suite["regimes"].items():
            if "as_served" in regime:
                _as_served(regime, cfg, f"{config_file}: key 'evals/{sid}/regimes/{rid}/as_served'")
    cfg["arms"] = arms
    return cfg


def _check_lora_targets(base: str, arms: dict) -> None:
    """Every LoRA arm's targets on the base, as far as its config.json tells
    (arenaflow.bases.lora_refusal): refused here rather than by a job down the lineage."""
    for arm, a in arms.items():
        hyper = a.get("hyper") or {}
        if hyper.get("method") != "lora":
            continue
        targets = (hyper.get("lora") or {}).get("target_modules") or []
        if why := bases.lora_refusal(base, targets):
            raise ConfigError(
                f"{a['file']}: arm {arm!r}: LoRA target_modules on base {base}: {why}"
            )


def _check_template_corpus(cfg: dict, registry, config_file: str) -> None:
    """A round template's corpus keys hold what a corpus's may: the schema leaves them open,
    since the template sets their pool and policy, so they are checked here as a corpus's."""
    t = cfg.get("continual")
    if t:
        corpus = {**t["corpus"], "pool": "template", "policy": BASE}
        ref = {"$ref": "config.schema.yaml#/properties/corpora/additionalProperties"}
        validate(corpus, ref, registry, config_file, at=("continual", "corpus"))


def _resolve_corpora(cfg: dict, schema: dict, raw: dict, arms_dir: Path, config_file: str) -> None:
    """Each corpus names a known pool and a known policy; its defaults are filled, its engine
    settings are the config's with its own over them."""
    corpus_props = schema_part(schema, "corpus")
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
        cfg["corpora"][cid] = filled(corpus_props, c)
        cfg["corpora"][cid]["engine"] = {**cfg["engine"], **c.get("engine", {})}
        if "scaffold" in c:  # its marker's default filled: the verify rule passes it
            if c["policy"] == "reference":
                raise ConfigError(f"{where}/scaffold': policy 'reference' samples nothing")
            scaffold = corpus_props["properties"]["scaffold"]
            cfg["corpora"][cid]["scaffold"] = filled(scaffold, c["scaffold"])


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
        suite = cfg["evals"][sid] = filled(schema_part(schema, "suite"), suite, schema["$defs"])
        suite["engine"] = {**cfg["engine"], **suite.get("engine", {})}
        if suite["shards"] > 1 and cfg["pools"][suite["pool"]].get("turns", 1) > 1:
            raise ConfigError(  # read turn by turn over every conversation: not split
                f"{config_file}: key 'evals/{sid}/shards': pool {suite['pool']!r} holds multi-turn "
                "conversations (turns > 1), read in one job; set shards: 1"
            )
        for regime in suite["regimes"].values():
            regime.setdefault("replicates", suite["replicates"])
        _prompt_regimes(suite, f"{config_file}: key 'evals/{sid}/system_prompts'")
    for cid, c in cfg["corpora"].items():
        if c["pool"] in eval_pools:
            raise ConfigError(
                f"{config_file}: key 'corpora/{cid}/pool': {c['pool']!r} is an evaluation pool; "
                "training on it would contaminate every readout"
            )


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


def _resolve_mc_guards(cfg: dict, schema: dict, arms: set, config_file: str) -> None:
    """Each guard's defaults are filled; the arms it is run on are known arms."""
    for gid, g in cfg.get("mc_guards", {}).items():
        g = cfg["mc_guards"][gid] = filled(schema_part(schema, "mc_guard"), g)
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
        # what registration's power plan and the judgement's admission read (rounds.gate)
        rnd["gating"] = afgate.gating_of(cfg, rnd, cfg["promotion"])
        for key, msg in afgate.snr_errors(rnd):
            raise ConfigError(f"{where}/{key}': {msg}")
        rnd["bar_resolved"] = afbar.resolve(rnd)  # every default and arm named, once


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
        j = cfg["judged"][jid] = filled(schema_part(schema, "judged"), j)
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
        b = cfg["budget"] = filled(schema_part(schema, "budget"), cfg["budget"])
        b["estimate"] = filled(schema_part(schema, "estimate"), b.get("estimate", {}))


def _resolve_bundles(cfg: dict, schema: dict, arms: dict, config_file: str) -> None:
    """Each bundle names a known arm or round; its and its serving block's defaults are filled."""
    bundle_props = schema["properties"]["bundles"]["additionalProperties"]
    for bid, b in cfg["bundles"].items():
        where = f"{config_file}: key 'bundles/{bid}"
        if "arm" in b and b["arm"] not in arms:
            raise ConfigError(f"{where}/arm': unknown arm {b['arm']!r}")
        if "round" in b and b["round"] not in cfg["rounds"]:
            raise ConfigError(f"{where}/round': unknown round {b['round']!r}")
        b = filled(bundle_props, b)
        b["serving"] = filled(bundle_props["properties"]["serving"], b["serving"])
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
