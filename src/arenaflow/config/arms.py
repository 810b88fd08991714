"""Arm files: loaded and validated, their kind (trained, merge, dose, nominee), their lineage.

Each arms_dir/<arm>.yaml is validated against arm.schema.yaml; a trained arm's init and corpus,
a merge's or dose's parents are known arms of one method; a lineage cycle is an error naming the
file and key that close it."""

from __future__ import annotations

import graphlib
import math
from pathlib import Path

from referencing import Registry

from arenaflow.config import continual
from arenaflow.schema import (
    BASE,
    DOSE,
    MERGE,
    NOMINEE,
    PREFERENCE_OBJECTIVES,
    RESERVED,
    TRAINED,
    ConfigError,
    filled,
    load_yaml,
    merge,
    result_hyper,
    validate,
    with_hyper_defaults,
)


def load_arms(arms_dir: Path, arm_schema: dict, registry: Registry) -> tuple[dict, dict]:
    """Return ({arm: raw arm config}, {arm: file path}) for every arms_dir/<arm>.yaml; a dose
    file with a list of alphas gives one arm per alpha (dose_ids)."""
    if not arms_dir.is_dir():
        raise ConfigError(f"arms_dir {arms_dir}: not a directory")
    arms, files = {}, {}
    for path in sorted(arms_dir.glob("*.yaml")):
        arm = path.stem
        validate(
            {"id": arm},
            {"properties": {"id": {"$ref": "arm.schema.yaml#/$defs/id"}}},
            registry,
            f"{path}: file name",
        )
        if arm in RESERVED:
            raise ConfigError(f"{path}: '{arm}' is reserved and cannot name an arm")
        data = load_yaml(path) or {}
        validate(data, arm_schema, registry, str(path))
        _check_kind(data, path)
        for aid, adata in dose_ids(arm, filled(arm_schema, data)).items():
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
        validate(data, arm_schema, registry, str(path))
        extra = sorted(set(data) - {"description", "hyper", "engine", "priority"})
        if extra:
            raise ConfigError(
                f"{path}: key '{extra[0]}': a round template's arm sets only description, "
                "hyper, engine and priority (the template gives its init and corpus)"
            )
        out[path.stem] = (filled(arm_schema, data), path)
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
    # the schema's defaults, config.yaml's train_defaults over them, the arm's own over those:
    # the one place a training's hyperparameters are filled (the job takes them as they are)
    hyper = with_hyper_defaults(merge(cfg["train_defaults"], data.get("hyper", {})))
    objective = hyper["objective"]
    for cid in mix:
        fmt = cfg["corpora"][cid]["format"]
        if (objective in PREFERENCE_OBJECTIVES) != (fmt == "pairs"):
            raise ConfigError(
                f"{where} 'hyper/objective': {objective!r} cannot train on corpus {cid!r} "
                f"(format {fmt!r}); dpo/simpo need format 'pairs', sft needs 'sft'"
            )
    if hyper["grouped_lora"] and not hyper["fused_lora"]:  # its members fall back to fused's
        raise ConfigError(
            f"{where} 'hyper/grouped_lora': true needs fused_lora true (train/lora_grouped "
            "groups lora_fused's linears)"
        )
    if hyper["heldout_rows"] and objective != "sft":
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
        "params_json": result_hyper(hyper),  # the training job's --params-json
        "engine": {**cfg["engine"], **data.get("engine", {})},  # the config's, the arm's over
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
