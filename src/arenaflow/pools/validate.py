"""The rows every pool must have (validate_rows): at least one row; id, prompt, category and, by
kind, gold, reference or constraints (arenaflow.instruct.constraints dicts; a multi-turn row's
`turns` one per constraint); an input no longer than the pool's `max_prompt_chars` (input_chars).
A bad row fails with file:line and the reason; nothing is skipped. A built pool with no rows is
refused where it is read (read_pool) and, under Snakemake, before any job runs (refuse_empty).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from arenaflow import io, manifest, paths
from arenaflow.chat import CONTROL_TOKENS
from arenaflow.instruct import constraints as ifconstraints

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


def validate_rows(
    rows: list[dict],
    path: str,
    kind: str = "math",
    max_prompt_chars: int | None = None,
    limit_key: str = "max_prompt_chars",
) -> None:
    """Fail on the first bad row with path:line and the reason; nothing is skipped. A row whose
    input_chars exceed `max_prompt_chars` fails naming `limit_key`, the config key that sets it."""
    if not rows:
        raise ValueError(f"{path}: no rows; a pool needs at least one prompt")
    fields = (
        ("id", "prompt", "gold", "category")
        if kind == "math"
        else ("id", "prompt", "reference", "category")
        if kind == "chat"
        else ("id", "prompt", "category")
    )
    seen: dict[str, int] = {}
    for line, row in enumerate(rows, start=1):
        for field in fields:
            if not isinstance(row.get(field), str) or not row[field]:
                raise ValueError(f"{path}:{line}: missing or empty {field!r}")
        if not ID_RE.match(row["id"]):
            raise ValueError(
                f"{path}:{line}: id {row['id']!r} has characters outside {ID_RE.pattern}"
            )
        if row["id"] in seen:
            raise ValueError(
                f"{path}:{line}: duplicate id {row['id']!r} (first on line {seen[row['id']]})"
            )
        seen[row["id"]] = line
        source = row.get("source") or f"{path}:{line}"  # an import's file:line
        _no_control_tokens(row, source)
        if kind == "ifeval":
            constraints = _constraints(row.get("constraints"), f"{path}:{line}")
            if "turns" in row:
                _turns(row["turns"], len(constraints), f"{path}:{line}")
        if max_prompt_chars is not None:
            _not_too_long(row, source, max_prompt_chars, limit_key)


def _not_too_long(row: dict, where: str, limit: int, key: str) -> None:
    """A prompt far beyond any model's context costs memory in proportion to its length (and
    attention to its square) in every job that decodes or trains on it."""
    n = input_chars(row)
    if n > limit:
        raise ValueError(
            f"{where}: the prompt is {n} characters (with any earlier turns), over {key} = "
            f"{limit}; shorten or drop the row, or raise the key"
        )


def input_chars(row: dict) -> int:
    """The characters a row gives the model as written, before the chat template: its earlier
    turns (`context`) and its prompt, or a multi-turn row's every user message (`turns`, the
    first of which is its prompt). Characters, not tokens: a pool is built without a tokenizer."""
    user = row["turns"] if isinstance(row.get("turns"), list) else [row["prompt"]]
    context = [m.get("content") for m in row.get("context") or [] if isinstance(m, dict)]
    return sum(len(t) for t in [*context, *user] if isinstance(t, str))


_REBUILD = "an empty pool is never read: delete the file and it is rebuilt from its config section"


def read_pool(path: str | os.PathLike, consumer: str = "reading a pool") -> list[dict]:
    """A built pool's rows, once its sidecar manifest verifies (required for pools/{pool}.jsonl:
    a row deleted or edited after the build is refused naming the file), refusing one with none:
    every stage would run on nothing, and the failure would come far downstream, after corpora
    and arms were rebuilt."""
    rows = io.read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: no rows; {_REBUILD}")
    manifest.require_output(path, consumer, paths.POOL)
    return rows


def empty(path: str | os.PathLike) -> bool:
    """Whether a JSONL file holds no row (zero bytes or blank lines only), read only as far as
    its first non-blank byte: cheap enough to check every built pool at every DAG build."""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return False
    return True


def refuse_empty(paths: Iterable[str | os.PathLike]) -> None:
    """Refuse the first of these built pools that exists and holds no row, naming it. Snakemake
    takes such a file as a built pool (and reruns every job after it where it is newer), so it
    is checked before any job runs."""
    for p in paths:
        if Path(p).is_file() and empty(p):
            raise ValueError(f"{p}: no rows; {_REBUILD}")


def no_template_markers(rows: list[dict], path: str, markers: Iterable[str]) -> None:
    """validate_rows's refusal of ChatML's control tokens, for the chat template a job renders
    in (chat.markers: its role and end-of-turn tokens, BOS, EOS): checked where both the pool
    and the tokenizer are known, by the jobs that render the pool's rows."""
    markers = tuple(markers)
    for line, row in enumerate(rows, start=1):
        source = f" (from {row['source']})" if row.get("source") else ""
        _no_control_tokens(row, f"{path}:{line}{source}", markers)


def _no_control_tokens(row: dict, where: str, markers: tuple[str, ...] = CONTROL_TOKENS) -> None:
    """Text that holds the chat template's markers would render as real turns (a prompt with
    `<|im_end|>\n<|im_start|>assistant` is a fake assistant turn inside every rendering of it)."""
    texts = {k: row.get(k) for k in ("prompt", "gold", "reference", "turns", "context")}
    for key, value in texts.items():
        found = [t for t in markers if t in json.dumps(value, ensure_ascii=False)]
        if found:
            raise ValueError(
                f"{where}: {key!r} holds the chat template's control token {found[0]!r}, which "
                "would render as a turn boundary; remove it from the source row"
            )


def _turns(turns, n_constraints: int, where: str) -> None:
    """A multi-turn row's user messages: one non-empty string per constraint (turn k adds
    constraint k, arenaflow.instruct.pool.conversations)."""
    if not isinstance(turns, list) or not all(isinstance(t, str) and t.strip() for t in turns):
        raise ValueError(f"{where}: 'turns' must be a list of non-empty strings, got {turns!r}")
    if len(turns) != n_constraints:
        raise ValueError(
            f"{where}: {len(turns)} turns but {n_constraints} constraints; a multi-turn row "
            "carries one constraint per turn"
        )


def _constraints(value, where: str) -> list[dict]:
    """A row's constraints, validated; a JSON string (as a parquet column holds them) is parsed."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{where}: unparsable constraint: 'constraints' is not valid JSON ({e.msg})"
            ) from None
    if not isinstance(value, list) or not value:
        raise ValueError(
            f"{where}: unparsable constraint: 'constraints' must be a non-empty list, got {value!r}"
        )
    try:
        return [ifconstraints.validate(c) for c in value]
    except ValueError as e:
        raise ValueError(f"{where}: unparsable constraint: {e}") from None
