"""Resumable sampling and readouts (arenaflow.decode.parts) on the embedded tiny model: a job
killed after some batches decodes only the rest when rerun, into the uninterrupted job's output;
parts of another job, or that fail their sha256, are decoded again."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from arenaflow import candidates, io
from arenaflow.decode import parts, sampling
from arenaflow.evals import readout
from arenaflow.pools import math as mathpool

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "models/tiny-arith"
# 3 prompts, k 2, batch_size 2: a prompt a batch, 3 batches
PARAMS = {"k": 2, "temperature": 0.8, "top_p": 1.0, "max_new_tokens": 4, "batch_size": 2}


class Killed(RuntimeError):
    """What the injected kill raises."""


@pytest.fixture
def decoded(monkeypatch):
    """Counts the batches decoded; kill(n) makes the job die once n more batches are done."""
    real = sampling._decode_batch
    state = {"batches": 0, "kill_after": None}

    def counted(*args, **kwargs):
        if state["kill_after"] is not None and state["batches"] >= state["kill_after"]:
            state["kill_after"] = None
            raise Killed("killed")
        state["batches"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(sampling, "_decode_batch", counted)

    def take() -> int:
        n, state["batches"] = state["batches"], 0
        return n

    def kill(after: int) -> None:
        state["kill_after"] = after

    return take, kill


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    io.write_jsonl(path, mathpool.generate(3, 11, "eval", {"add": 1, "sub": 1}, "e"))
    return path


@pytest.fixture(scope="module")
def whole(pool, tmp_path_factory) -> bytes:
    """The uninterrupted sampling job's samples (seed 0, hf)."""
    return sample(pool, tmp_path_factory.mktemp("whole") / "samples.jsonl").read_bytes()


def sample(pool: Path, out: Path, engine: str = "hf", **params) -> Path:
    candidates.main(
        [
            "sample",
            "--pool",
            str(pool),
            "--base-model",
            str(BASE),
            "--params-json",
            json.dumps({**PARAMS, "seed": 0, "engine": {"decoder": engine}, **params}),
            "--out",
            str(out),
        ]
    )
    return out


def killed_sample(
    pool: Path, out: Path, decoded, after: int, engine: str = "hf", **params
) -> list[Path]:
    """A sampling job killed once `after` batches are done: its parts, in batch order."""
    take, kill = decoded
    kill(after)
    with pytest.raises(Killed):
        sample(pool, out, engine, **params)
    assert take() == after and not out.exists()
    return sorted(parts.parts_dir(out).glob("part-*.jsonl"))


@pytest.mark.parametrize("engine", ["hf", "static"])
def test_a_killed_sampling_job_resumes_to_the_uninterrupted_samples(
    engine, pool, whole, tmp_path, decoded
):
    take, _ = decoded
    if engine != "hf":
        whole = sample(pool, tmp_path / "whole/samples.jsonl", engine).read_bytes()
        take()
    out = tmp_path / "c/samples.jsonl"
    kept = killed_sample(pool, out, decoded, 2, engine)
    assert [p.name[:11] for p in kept] == ["part-000000", "part-000001"]
    sample(pool, out, engine)
    assert take() == 1  # only the batch the kill left
    assert out.read_bytes() == whole
    assert not parts.parts_dir(out).exists()  # gone once the output is written


def test_parts_of_another_job_or_failing_their_hash_are_decoded_again(
    pool, whole, tmp_path, decoded, capsys
):
    out = tmp_path / "c/samples.jsonl"
    killed_sample(pool, out, decoded, 2, seed=1)
    # seed 0 decodes both batches again before its own kill: seed 1's parts were not reused
    first, second = killed_sample(pool, out, decoded, 2)
    assert "parts of another job (its job.json differs): discarded" in capsys.readouterr().err
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x01
    first.write_bytes(bytes(data))
    second.write_bytes(second.read_bytes()[:-5])  # truncated
    take, _ = decoded
    sample(pool, out)
    assert take() == 3
    err = capsys.readouterr().err
    assert all(f"{p}: does not match the sha256 in its name" in err for p in (first, second))
    assert out.read_bytes() == whole


def read(pool: Path, out: Path, seed: int = 0, temperature: float = 0.8) -> Path:
    decoding = {"temperature": temperature, "top_p": 1.0, "max_new_tokens": 4}
    readout.main(
        [
            "readout",
            "--suite",
            "math",
            "--arm",
            "base",
            "--pool",
            str(pool),
            "--base-model",
            str(BASE),
            "--regime",
            "served",
            "--regime-json",
            json.dumps(decoding),
            "--seed",
            str(seed),
            "--batch-size",
            "1",
            "--out",
            str(out),
        ]
    )
    return out


def test_a_killed_readout_resumes_to_the_same_rows_past_other_and_bad_parts(
    pool, tmp_path, decoded, capsys
):
    take, kill = decoded
    whole = pd.read_parquet(read(pool, tmp_path / "whole.parquet"))
    assert take() == 3  # 3 items, 1 a batch
    out = tmp_path / "r.parquet"
    for temperature in (0.5, 0.8):  # the second decodes both batches: 0.5's are not reused
        kill(2)
        with pytest.raises(Killed):
            read(pool, out, temperature=temperature)
        assert take() == 2 and not out.exists()
    assert "parts of another job" in capsys.readouterr().err
    first = sorted(parts.parts_dir(out).glob("part-*.jsonl"))[0]
    first.write_bytes(first.read_bytes().replace(b'"text": "', b'"text": "1', 1))
    read(pool, out)
    assert take() == 2  # the corrupt part's batch and the one the kill left
    assert f"{first}: does not match the sha256" in capsys.readouterr().err
    pd.testing.assert_frame_equal(pd.read_parquet(out), whole)
    assert not parts.parts_dir(out).exists()


def test_a_readout_plan_killed_in_its_second_readout_keeps_the_first_ones_batches(
    pool, tmp_path, decoded
):
    take, kill = decoded
    plan = [
        {"regime": r, "decoding": {"temperature": t, "max_new_tokens": 4}, "replicate": 0}
        for r, t in (("greedy", 0.0), ("served", 0.8))
    ]
    plan = [{**read, "out": str(tmp_path / f"{read['regime']}.r0.parquet")} for read in plan]
    args = ["readout", "--suite", "math", "--arm", "base", "--pool", str(pool)]
    args += ["--base-model", str(BASE), "--batch-size", "1", "--plan", json.dumps(plan)]
    kill(4)  # the first readout's 3 batches and the second's first
    with pytest.raises(Killed):
        readout.main(args)
    assert take() == 4
    first = Path(plan[0]["out"])
    whole = pd.read_parquet(first)
    first.unlink()  # as Snakemake removes a failed job's outputs
    readout.main(args)
    assert take() == 2  # the second readout's last two batches alone
    pd.testing.assert_frame_equal(pd.read_parquet(first), whole)
    assert not any(parts.parts_dir(r["out"]).exists() for r in plan)
