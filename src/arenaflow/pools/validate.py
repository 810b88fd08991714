"""The rows every pool must have (validate_rows): id, prompt, category and, by kind, gold,
reference or constraints (arenaflow.instruct.constraints dicts; a multi-turn row's `turns` one
per constraint). A bad row fails with file:line and the reason; nothing is skipped.
"""

from __future__ import annotations

import json
import re

from arenaflow.chat import CONTROL_TOKENS
from arenaflow.instruct import constraints as ifconstraints

ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


def validate_rows(rows: list[dict], path: str, kind: str = "math") -> None:
    """Fail on the first bad row with path:line and the reason; nothing is skipped."""
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
        _no_control_tokens(row, row.get("source") or f"{path}:{line}")  # an import's file:line
        if kind == "ifeval":
            constraints = _constraints(row.get("constraints"), f"{path}:{line}")
            if "turns" in row:
                _turns(row["turns"], len(constraints), f"{path}:{line}")


def _no_control_tokens(row: dict, where: str) -> None:
    """Text that holds the chat template's markers would render as real turns (a prompt with
    `<|im_end|>\n<|im_start|>assistant` is a fake assistant turn inside every rendering of it)."""
    texts = {k: row.get(k) for k in ("prompt", "gold", "reference", "turns", "context")}
    for key, value in texts.items():
        found = [t for t in CONTROL_TOKENS if t in json.dumps(value, ensure_ascii=False)]
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
