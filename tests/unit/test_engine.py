"""arenaflow.engine and arenaflow.knobs: behaviour is config; the environment holds only test and
benchmark hooks, read in one module."""

import ast
import re
from pathlib import Path

import pytest

from arenaflow import engine, knobs, schema

SRC = Path(__file__).resolve().parents[2] / "src" / "arenaflow"


def string_constants(path: Path) -> list[str]:
    return [
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def test_only_knobs_names_an_environment_variable_of_arenaflow():
    named = {
        f"{p.relative_to(SRC)}: {s}"
        for p in SRC.rglob("*.py")
        if p.name != "knobs.py"
        for s in string_constants(p)
        if re.fullmatch(r"ARENAFLOW_[A-Z_]+", s)
    }
    assert not named, sorted(named)
    assert all(name.startswith("ARENAFLOW_") for name in knobs.ALL)
    with pytest.raises(KeyError, match="ARENAFLOW_DECODE_STEP is not one of"):
        knobs.get("ARENAFLOW_DECODE_STEP")


def test_every_engine_setting_is_read_by_the_code():
    """No setting that nothing reads: each key of the schema's engine block is get() somewhere."""
    source = "\n".join(p.read_text() for p in SRC.rglob("*.py"))
    unread = [k for k in schema.schema_defaults("engine") if f'.get("{k}")' not in source]
    assert not unread


def test_a_job_runs_with_its_settings_and_leaves_none_behind():
    before = engine.settings()
    assert before == schema.schema_defaults("engine")
    with engine.job('{"decoder": "static", "decode_warmup": false}'):
        assert engine.get("decoder") == "static" and engine.get("decode_warmup") is False
        assert engine.get("decode_step") == "auto"  # the schema's default under them
        with engine.using(decode_step="hf"):
            assert (engine.get("decoder"), engine.get("decode_step")) == ("static", "hf")
        assert engine.get("decode_step") == "auto"
    assert engine.settings() == before


def test_an_unknown_setting_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['decode_path'\]"):
        engine.use({"decode_path": "llama"})
