"""Pools imported from a file (a pool section with `file`, .jsonl or .parquet): GSM8K or MATH
problems, ifeval prompts with constraints, open-ended prompts or chat conversations, as pool rows
(import_rows), optionally one band of the file or a seeded sample of it; and the config's check
of the sections' `band`s (check_bands).
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

# the module, not its names: arenaflow.config imports this module (check_bands)
from arenaflow import io
from arenaflow import schema as afschema
from arenaflow.answers import last_boxed
from arenaflow.pools.exclude import Excluded
from arenaflow.pools.validate import ID_RE, _constraints

# MATH subjects' category names: lineage 000's (alg, pre, num, cnt;
# docs/lineages.md#000-lineage-and-corpora) and the like; other subjects get a slug
MATH_TYPES = {
    "Algebra": "alg",
    "Prealgebra": "pre",
    "Number Theory": "num",
    "Counting & Probability": "cnt",
    "Geometry": "geo",
    "Intermediate Algebra": "int_alg",
    "Precalculus": "precalc",
}
_CALC = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations, e.g. <<48/2=24>>
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def read_table(path: Path, shown: str) -> list[tuple[int, dict]]:
    """(line, row) pairs of a .jsonl (1-based line numbers, blank lines skipped) or .parquet
    (1-based row numbers); a missing value (null, NaN) reads as None."""
    if not path.is_file():
        raise ValueError(
            f"{shown}: no such file ({path}; a relative path is relative to the workflow's root)"
        )
    if path.suffix == ".jsonl":
        return io.read_jsonl_numbered(path, shown)
    if path.suffix == ".parquet":
        import pandas as pd

        records = pd.read_parquet(path).to_dict("records")
        return [(i, {k: _plain(v) for k, v in r.items()}) for i, r in enumerate(records, start=1)]
    raise ValueError(f"{shown}: unsupported file type {path.suffix!r}; expected .jsonl or .parquet")


def _plain(v):
    """numpy scalars and arrays to Python values, NaN to None."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _text(row: dict, field: str, where: str, what: str = "") -> str:
    v = row.get(field)
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"{where}: {what or 'missing or empty'} {field!r}")
    return v


def _gsm8k(row: dict, where: str) -> dict:
    question = _text(row, "question", where)
    answer = _text(row, "answer", where, "missing gold: missing or empty")
    if "####" not in answer:
        raise ValueError(f"{where}: missing gold: 'answer' has no '#### N' line")
    work, gold = answer.rsplit("####", 1)
    gold = gold.strip()
    if not gold:
        raise ValueError(f"{where}: missing gold: nothing after '####'")
    if _THOUSANDS.match(gold):
        gold = gold.replace(",", "")  # strict comparison is on strings: keep one spelling of N
    work = _CALC.sub("", work).strip()
    return {
        "prompt": question,
        "gold": gold,
        "category": "gsm8k",
        "reference": f"{work}\nThe answer is {gold}." if work else f"The answer is {gold}.",
    }


def _math(row: dict, where: str) -> dict:
    problem = _text(row, "problem", where)
    solution = _text(row, "solution", where, "missing gold: missing or empty")
    gold = last_boxed(solution)
    if not gold:
        raise ValueError(f"{where}: missing gold: 'solution' has no non-empty \\boxed{{...}}")
    kind = row.get("type")
    category = (
        MATH_TYPES.get(kind) or re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_")
        if isinstance(kind, str) and kind.strip()
        else "math"
    )
    out = {"prompt": problem, "gold": gold, "category": category, "reference": solution}
    for field in ("level", "type"):
        if row.get(field) is not None:
            out[f"math_{field}"] = str(row[field])
    return out


def _ifeval(row: dict, where: str) -> dict:
    constraints = _constraints(row.get("constraints"), where)
    return {
        "prompt": _text(row, "prompt", where),
        "constraints": constraints,
        "category": constraints[0]["type"],
    }


def _open(row: dict, where: str) -> dict:
    return {"prompt": _text(row, "prompt", where), "category": "open"}


def _chat(row: dict, where: str) -> dict:
    """A conversation in the public chat corpora's format (Tulu 3, SmolTalk: a `messages` list
    of role/content turns ending in an assistant turn): the last user turn is the prompt, the
    turns before it its `context`, the last assistant turn its `reference`."""
    msgs = row.get("messages")
    if not isinstance(msgs, list) or len(msgs) < 2:
        raise ValueError(f"{where}: 'messages' must be a list of at least 2 turns, got {msgs!r}")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise ValueError(
                f"{where}: messages[{i}] must be {{role: system|user|assistant, content}}"
            )
        _text(m, "content", f"{where}: messages[{i}]")
        if set(m) - {"role", "content"}:
            # arenaflow.chat renders a turn's role and content; tool calls and the like would
            # be dropped silently from training and readouts
            raise ValueError(
                f"{where}: messages[{i}] has keys {sorted(set(m) - {'role', 'content'})} "
                "beside role and content, which arenaflow.chat cannot render"
            )
    if msgs[-1]["role"] != "assistant" or msgs[-2]["role"] != "user":
        raise ValueError(f"{where}: 'messages' must end with a user turn and an assistant turn")
    out = {"prompt": msgs[-2]["content"], "reference": msgs[-1]["content"], "category": "chat"}
    return {**out, "context": msgs[:-2]} if len(msgs) > 2 else out


def band_of(rows: list, band: dict, shown: str) -> list:
    """Band `index` (from 0) of `of` contiguous bands of `rows` in file order (sizes differ by
    at most one), after checking that no text of this band occurs in another band, so that
    successive epochs over the bands never see a text twice (lineage 002's SFT stage:
    docs/lineages.md#002-sft-dpo-and-if-repair)."""
    i, k = band["index"], band["of"]
    if not 0 <= i < k or k > len(rows):
        raise ValueError(f"{shown}: band {i} of {k} does not exist in {len(rows)} rows")
    cuts = [len(rows) * j // k for j in range(k + 1)]
    owner: dict[str, tuple[int, str]] = {}
    for j in range(k):
        for r in rows[cuts[j] : cuts[j + 1]]:
            key = json.dumps([r.get("context"), r["prompt"], r.get("reference")])
            first = owner.setdefault(key, (j, r["source"]))
            if first[0] != j and i in (j, first[0]):
                raise ValueError(
                    f"{r['source']}: the same text as {first[1]}, in band {first[0]}: bands "
                    f"{first[0]} and {j} of {k} are not disjoint; drop the duplicate row"
                )
    return rows[cuts[i] : cuts[i + 1]]


def import_rows(
    pool: str, params: dict, root: Path | None = None, exclude: Excluded | None = None
) -> list[dict]:
    """Pool rows from params['file'], less `exclude`d ones (the row format of each kind:
    arenaflow.pools.build.build). A relative `file` is relative to the workflow's root (`root`,
    which arenaflow.config puts beside it). An `id` column, if the file has one, is kept as the
    row id (else {pool}-{line:05d}); `source` is file:line (the 1-based line of a .jsonl, row of
    a .parquet). A bad row (missing or duplicate id, missing gold, unparsable constraint) fails
    with file:line and the reason; nothing is silently skipped. With `n`, an import keeps a
    seeded sample of n rows, in file order."""
    params = {**afschema.schema_defaults("pool"), **params}
    kind, shown = params["kind"], params["file"]
    table = read_table(Path(params.get("root", root or afschema.REPO_ROOT)) / shown, shown)
    if not table:
        raise ValueError(f"{shown}: no rows")
    if kind == "math":
        fmt = params.get("format") or _detect(table[0], shown)
        convert = {"gsm8k": _gsm8k, "math": _math}[fmt]
    else:
        convert = {"ifeval": _ifeval, "open": _open, "chat": _chat}[kind]
    has_ids = any(row.get("id") is not None for _, row in table)
    rows, seen = [], {}
    for line, raw in table:
        where = f"{shown}:{line}"
        row = convert(raw, where)
        if has_ids:
            rid = raw.get("id")
            if rid is None or isinstance(rid, bool) or str(rid).strip() == "":
                raise ValueError(f"{where}: missing id (the file has an 'id' column)")
            rid = str(rid)
            if not ID_RE.match(rid):
                raise ValueError(f"{where}: id {rid!r} has characters outside {ID_RE.pattern}")
            if rid in seen:
                raise ValueError(f"{where}: duplicate id {rid!r} (first on line {seen[rid]})")
            seen[rid] = line
        else:
            rid = f"{pool}-{line:05d}"
        if kind != "math" and isinstance(raw.get("category"), str) and raw["category"].strip():
            row["category"] = raw["category"]
        if kind == "open":
            row["min_chars"] = params["min_chars"]
        rows.append({"id": rid, **row, "source": where})
    if "band" in params:  # bands of the whole file: excluding rows must not move them
        rows = band_of(rows, params["band"], shown)
    if exclude:  # before the sample, so that n rows are still kept
        rows = _unexcluded(pool, params, rows, exclude)
    if "n" in params:
        if params["n"] > len(rows):
            raise ValueError(f"{shown}: n={params['n']} but the file has only {len(rows)} rows")
        keep = sorted(random.Random(params["seed"]).sample(range(len(rows)), params["n"]))
        rows = [rows[i] for i in keep]
    return rows


def _unexcluded(pool: str, params: dict, rows: list[dict], exclude: Excluded) -> list[dict]:
    """`rows` less those whose prompt an excluded pool has; an error naming the pool if fewer
    than it needs (n, or at least one) are left."""
    left = [r for r in rows if not exclude.drops(r["prompt"])]
    if len(left) < params.get("n", 1):
        raise ValueError(
            f"pool {pool}: {params['file']} has {len(rows)} rows, but only {len(left)} "
            f"are left after dropping {exclude.skipped} whose prompt an excluded pool "
            f"has; need {params.get('n', 1)}"
        )
    return left


def _detect(first: tuple[int, dict], shown: str) -> str:
    line, row = first
    if "question" in row and "answer" in row:
        return "gsm8k"
    if "problem" in row and "solution" in row:
        return "math"
    raise ValueError(
        f"{shown}:{line}: cannot tell the format: expected 'question' and 'answer' "
        f"(GSM8K) or 'problem' and 'solution' (MATH); found {sorted(row)}"
    )


def check_bands(pools: dict) -> list[tuple[str, str]]:
    """Problems with the pools' `band`s, as (key, message): two pools banding one file must cut
    it into the same number of bands (else the bands overlap) and take different ones (else two
    epochs read the same slice)."""
    problems, seen = [], {}
    for pid, pool in pools.items():
        if "band" not in pool:
            continue
        band, f = pool["band"], pool.get("file")
        if band["index"] >= band["of"]:
            problems.append(
                (
                    f"pools/{pid}/band/index",
                    f"band {band['index']} of {band['of']}: "
                    f"bands are numbered 0 to {band['of'] - 1}",
                )
            )
        for other in seen.get(f, []):
            o = pools[other]["band"]
            if o["of"] != band["of"]:
                problems.append(
                    (
                        f"pools/{pid}/band/of",
                        f"pool {other!r} cuts {f} into {o['of']} "
                        f"bands, this pool into {band['of']}: the bands would overlap",
                    )
                )
            elif o["index"] == band["index"]:
                problems.append(
                    (
                        f"pools/{pid}/band/index",
                        f"pool {other!r} already reads band {band['index']} of {f}",
                    )
                )
        seen.setdefault(f, []).append(pid)
    return problems
