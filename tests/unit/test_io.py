"""arenaflow.io: atomic writes and JSON/JSONL with path:line errors."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from arenaflow import io


class Boom(RuntimeError):
    pass


def test_atomic_path_leaves_no_file_when_the_block_raises(tmp_path):
    target = tmp_path / "deep" / "out.json"
    with pytest.raises(Boom), io.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise Boom
    assert not target.exists()
    assert list(target.parent.iterdir()) == []  # no temporary left behind either


def test_atomic_path_keeps_the_old_file_when_the_block_raises(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(Boom), io.atomic_path(target) as tmp:
        tmp.write_text("new")
        raise Boom
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_path_replaces_on_success_with_shareable_mode(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with io.atomic_path(target) as tmp:
        assert tmp != target and tmp.parent == target.parent
        tmp.write_text("new")
        assert target.read_text() == "old"  # not visible until the block ends
    assert target.read_text() == "new"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_atomic_dir_leaves_nothing_when_the_block_raises(tmp_path):
    target = tmp_path / "corpus"
    with pytest.raises(Boom), io.atomic_dir(target) as tmp:
        (tmp / "rows.jsonl").write_text("{}\n")
        raise Boom
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_an_existing_dir_wholesale(tmp_path):
    target = tmp_path / "corpus"
    target.mkdir()
    (target / "stale.txt").write_text("stale")
    with io.atomic_dir(target) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "new.txt").write_text("new")
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        "sub",
        "sub/new.txt",
    ]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(target / "sub" / "new.txt").st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["corpus"]


def test_jsonl_round_trip_keeps_rows_and_unicode(tmp_path):
    rows = [{"id": "a", "text": "héllo 日本 🎉", "n": 1}, {"id": "b", "nested": {"x": [1, 2]}}]
    path = tmp_path / "rows.jsonl"
    io.write_jsonl(path, rows)
    assert io.read_jsonl(path) == rows
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and "日本" in lines[0]  # one object per line, not escaped


def test_json_round_trip(tmp_path):
    obj = {"b": [1, 2.5, None], "a": "ü"}
    io.write_json(tmp_path / "x.json", obj)
    assert io.read_json(tmp_path / "x.json") == obj
    assert json.loads((tmp_path / "x.json").read_text(encoding="utf-8")) == obj


def test_read_jsonl_skips_blank_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n   \n{"a": 2}\n')
    assert io.read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_read_jsonl_bad_json_names_path_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2,}\n{"a": 3}\n')  # line 3 is bad; line 2 blank still counts
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: not valid JSON"):
        io.read_jsonl(path)


def test_read_jsonl_non_object_names_path_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(path))}:2: expected a JSON object, got list"
    ):
        io.read_jsonl(path)
