"""Continual rounds as config: round templates instantiated and nominee references resolved.

Both turn into plain config before anything else is resolved, so every later check (unknown
names, cycles, the bar) sees ordinary pools, corpora, arms and rounds. What they mean and the
jobs of a round: arenaflow.rounds.continual."""

from __future__ import annotations

import copy
from pathlib import Path

from arenaflow.schema import NOMINEE, nominee_id, round_ids


def expand(cfg: dict, raw: dict, files: dict, template_arms, config_file: str, error) -> None:
    """Instantiate cfg['continual'] in place: pools, corpora and rounds into cfg, arms into
    raw/files. `template_arms(dir)` loads and validates the template's arm files:
    {stem: (data, path)}."""
    t = cfg.get("continual")
    if not t:
        return
    where = f"{config_file}: key 'continual"
    if t["after"] not in cfg["rounds"]:
        raise error(f"{where}/after': unknown round {t['after']!r}; known: {sorted(cfg['rounds'])}")
    grid = template_arms(t["arms_dir"])
    if not grid:
        raise error(f"{where}/arms_dir': no <arm>.yaml files in {t['arms_dir']}")
    after = cfg["rounds"][t["after"]]
    earlier = sorted(  # an unknown pool is the corpus's error, reported there
        {c["pool"] for c in cfg["corpora"].values()} & set(cfg["pools"]) - _eval_pools(cfg)
    )
    prev = t["after"]
    for i, rnd in enumerate(round_ids(t["after"], t["rounds"], where, error), start=1):
        _taken(cfg, raw, rnd, where, error)
        pool, corpus = f"{rnd}-pool", f"{rnd}-corpus"
        cfg["pools"][pool] = {
            **copy.deepcopy(t["pool"]),
            "seed": t["pool"].get("seed", 0) + i,
            "exclude": [*earlier],
        }
        earlier.append(pool)
        cfg["corpora"][corpus] = {
            **copy.deepcopy(t["corpus"]),
            "pool": pool,
            "policy": {NOMINEE: prev},
        }
        arms = []
        for stem, (data, path) in grid.items():
            arm = f"{rnd}-{stem}"
            raw[arm] = {**copy.deepcopy(data), "init": {NOMINEE: prev}, "corpus": corpus}
            files[arm] = path
            arms.append(arm)
        control = (
            {"control": after["control"]} if "control" in after else {}
        )  # the same bar: same arms
        cfg["rounds"][rnd] = {
            "suite": t.get("suite", after["suite"]),
            "regime": t.get("regime", after["regime"]),
            "incumbent": {NOMINEE: prev},
            "candidates": arms,
            **control,
            "bar": copy.deepcopy(t.get("bar", after["bar"])),
            "description": f"continual round {i} of {t['rounds']} after {t['after']}",
        }
        prev = rnd


def _eval_pools(cfg: dict) -> set:
    return {s["pool"] for s in cfg["evals"].values()}


def _taken(cfg: dict, raw: dict, rnd: str, where: str, error) -> None:
    clash = [
        f"{k} {i!r}"
        for k, ids in (
            ("round", cfg["rounds"]),
            ("pool", cfg["pools"]),
            ("corpus", cfg["corpora"]),
            ("arm", raw),
        )
        for i in ids
        if i == rnd or i.startswith(f"{rnd}-")
    ]
    if clash:
        raise error(f"{where}': round {rnd} would redefine {', '.join(clash)}")


def resolve_refs(cfg: dict, raw: dict, files: dict, config_file: str, error) -> None:
    """Replace every {nominee: round} by the alias arm's id and add the alias arms to raw."""

    def ref(value, where: str):
        if not isinstance(value, dict):
            return value
        rnd = value[NOMINEE]
        if rnd not in cfg["rounds"]:
            raise error(
                f"{where}: unknown round {rnd!r} in {{nominee: {rnd}}}; "
                f"known: {sorted(cfg['rounds'])}"
            )
        alias = nominee_id(rnd)
        if alias in raw and NOMINEE not in raw[alias]:
            raise error(f"{files[alias]}: arm id {alias!r} is taken by round {rnd}'s nominee")
        raw[alias], files[alias] = {NOMINEE: rnd}, config_file
        return alias

    for cid, c in cfg["corpora"].items():
        c["policy"] = ref(c["policy"], f"{config_file}: key 'corpora/{cid}/policy'")
    for rid, r in cfg["rounds"].items():
        r["incumbent"] = ref(r["incumbent"], f"{config_file}: key 'rounds/{rid}/incumbent'")
    for arm, data in list(raw.items()):
        if "init" in data:
            data["init"] = ref(data["init"], f"{files.get(arm, config_file)}: key 'init'")


def nominee_arm(data: dict, cfg: dict, raw: dict, config_file, error) -> dict:
    """The resolved alias arm: its parents are every arm its round may promote."""
    rid = data[NOMINEE]
    r = cfg["rounds"][rid]
    for key, a in [
        ("incumbent", r["incumbent"]),
        *((f"candidates/{i}", c) for i, c in enumerate(r["candidates"])),
    ]:
        if a != "base" and a not in raw:
            raise error(f"{config_file}: key 'rounds/{rid}/{key}': unknown arm {a!r}")
    return {
        "kind": NOMINEE,
        "round": data[NOMINEE],
        "init": r["incumbent"],
        "corpus": None,
        "mix": {},
        "parents": [a for a in [r["incumbent"], *r["candidates"]] if a != "base"],
        "description": f"the arm round {data[NOMINEE]} promotes (its incumbent if none clears)",
        "hyper": {},
        "priority": 1,
        "file": str(config_file),
    }


def arm_dir(path: str, root: Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else root / p
