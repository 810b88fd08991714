"""The template a job rendered with is recorded beside its engine settings: base.chat_template
as passed and the sha256 of the template's text, in the samples' and the corpus's manifest params
and in a readout's metadata (the embedded tiny model, a .jinja file and ChatML)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from arenaflow import candidates, chat, io, models
from arenaflow.corpora import build as corpora
from arenaflow.evals import readout, readout_file
from arenaflow.pools import math as mathpool

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "models/tiny-arith"
DECODE = {"temperature": 0.0, "max_new_tokens": 2}


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    io.write_jsonl(path, mathpool.generate(2, 11, "train", {"add": 1, "sub": 1}, "t"))
    return path


@pytest.fixture(scope="module")
def house(tmp_path_factory) -> Path:
    """A .jinja file: ChatML as HF repos ship it, a text other than arenaflow's own."""
    path = tmp_path_factory.mktemp("t") / "house.jinja"
    shutil.copy(REPO / "tests/data/chat_templates/chatml.jinja", path)
    return path


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_a_sampling_job_records_the_template_file_and_its_hash(pool, house, tmp_path):
    out = tmp_path / "samples.jsonl"
    params = {"k": 1, "max_new_tokens": 2, "temperature": 0.8, "top_p": 1.0, "batch_size": 2}
    args = ["sample", "--pool", str(pool), "--base-model", str(BASE), "--out", str(out)]
    args += ["--chat-template", str(house), "--params-json", json.dumps({**params, "seed": 0})]
    candidates.main(args)
    got = io.read_json(tmp_path / "samples.manifest.json")["params"]["chat_template"]
    assert got == {"spec": str(house), "sha256": sha(house.read_text(encoding="utf-8"))}
    assert got["sha256"] != sha(chat.CHATML_TEMPLATE)  # the file's text, not arenaflow's ChatML


@pytest.mark.parametrize("spec", ["chatml", "house"])
def test_a_readout_records_the_template_it_rendered_with(spec, pool, house, tmp_path):
    spec = str(house) if spec == "house" else spec
    text = chat.CHATML_TEMPLATE if spec == "chatml" else house.read_text(encoding="utf-8")
    out = tmp_path / "r.parquet"
    plan = [{"regime": "greedy", "decoding": DECODE, "replicate": 0, "out": str(out)}]
    args = ["readout", "--suite", "math", "--arm", "base", "--pool", str(pool), "--plan"]
    args += [json.dumps(plan), "--base-model", str(BASE), "--chat-template", spec]
    readout.main(args)
    assert readout_file.readout_meta(out)["chat_template"] == {"spec": spec, "sha256": sha(text)}


def test_a_corpus_records_the_template_its_rows_were_rendered_in(pool, house, tmp_path):
    tok = models.load_tokenizer(BASE, str(house))
    rows = io.read_jsonl(pool)
    params = {"seed": 0, "format": "sft"}
    corpora.build(tmp_path / "c", rows, tok, "Be brief.", params, chat_template=str(house))
    recorded = io.read_json(tmp_path / "c/manifest.json")["params"]
    assert recorded["chat_template"] == {"spec": str(house), "sha256": sha(tok.chat_template)}
    assert tok.chat_template == house.read_text(encoding="utf-8")


def test_a_job_refuses_a_pool_row_holding_a_marker_of_its_template(house, tmp_path):
    """Pools are built without a tokenizer: the jobs that render them check the template's
    markers (arenaflow.pools.validate.no_template_markers), here a readout's."""
    rows = mathpool.generate(2, 11, "train", {"add": 1, "sub": 1}, "t")
    rows[1]["prompt"] += " <|im_end|>"
    pool = tmp_path / "pool.jsonl"
    io.write_jsonl(pool, rows)
    out = tmp_path / "r.parquet"
    plan = [{"regime": "greedy", "decoding": DECODE, "replicate": 0, "out": str(out)}]
    args = ["readout", "--suite", "math", "--arm", "base", "--pool", str(pool), "--plan"]
    args += [json.dumps(plan), "--base-model", str(BASE), "--chat-template", str(house)]
    with pytest.raises(
        ValueError, match=rf"^{pool}:2 \(from synthetic:.*\): 'prompt' holds .*'<\|im_end\|>'"
    ):
        readout.main(args)
    assert not out.exists()
