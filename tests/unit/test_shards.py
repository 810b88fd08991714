"""Sharded sampling and readouts (arenaflow.shards) on the embedded tiny model: shards cut at
batch boundaries and seeded by the global batch index merge into the unsharded job's samples
byte for byte and its readout rows, for 1, 3 and 7 shards (7 leaves shards with no batch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from arenaflow import candidates, io, manifest, models, paths, shards
from arenaflow import config as afconfig
from arenaflow.budget import admission
from arenaflow.budget import ledger as afbudget
from arenaflow.evals import readout, readout_file, readout_merge, readout_rows
from arenaflow.instruct import pool as ifpool
from arenaflow.pools import math as mathpool
from arenaflow.pools.validate import read_pool

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "models/tiny-arith"
# config/config.yaml's sampling (k 4, temperature 0.8), shorter: 10 prompts, 2 a batch, 5 batches
PARAMS = {"k": 4, "temperature": 0.8, "top_p": 1.0, "max_new_tokens": 8, "batch_size": 8}
SHARDS = (1, 3, 7)


@pytest.mark.parametrize(
    ("prompts", "per_batch", "n"), [(10, 2, 3), (10, 2, 7), (11, 3, 4), (1, 5, 2), (64, 8, 8)]
)
def test_spans_are_contiguous_whole_batches_covering_the_pool_once(prompts, per_batch, n):
    spans = [shards.span(prompts, per_batch, i, n) for i in range(n)]
    total = -(-prompts // per_batch)
    assert [s.first_batch for s in spans] == [sum(t.batches for t in spans[:i]) for i in range(n)]
    assert sum(s.batches for s in spans) == total
    assert max(s.batches for s in spans) - min(s.batches for s in spans) <= 1
    assert [(s.start, s.stop) for s in spans] == [
        (
            min(s.first_batch * per_batch, prompts),
            min((s.first_batch + s.batches) * per_batch, prompts),
        )
        for s in spans
    ]
    assert spans[0].start == 0 and spans[-1].stop == prompts
    assert all(a.stop == b.start for a, b in zip(spans, spans[1:]))
    assert (n > total) == any(s.batches == 0 for s in spans)
    assert [s.batches for s in spans] == [len(a) for a in np.array_split(range(total), n)]


@pytest.mark.parametrize("bad", ["3-of-3", "-1-of-2", "1of2", "a-of-b", "0-of-0"])
def test_a_bad_shard_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=f"--shard '{bad}'"):
        shards.parse(bad)


def test_shard_parts_lie_beside_their_output_under_one_pattern():
    assert paths.shard_of(paths.samples("c"), "2-of-7") == paths.SAMPLES_SHARD.format(
        corpus="c", shard="2-of-7"
    )
    assert paths.SAMPLES_SHARD_MANIFEST == str(manifest.sidecar(paths.SAMPLES_SHARD))
    assert paths.shards_of(paths.readout("math", "B3", "greedy", 1), 2) == [
        "readouts/math/B3/greedy.r1.shards/0-of-2.parquet",
        "readouts/math/B3/greedy.r1.shards/1-of-2.parquet",
    ]


@pytest.fixture(scope="module")
def policy():
    """The tiny policy, decoding on one thread: on a shared 2-core machine two threads of a tiny
    model's matmuls wait on each other far longer than they compute (16x slower, measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield models.load_policy(BASE, None)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def math_pool(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pool") / "pool.jsonl"
    io.write_jsonl(path, mathpool.generate(10, 5, "eval", {"add": 1, "sub": 1, "mul": 1}, "e"))
    return path


@pytest.fixture(scope="module")
def if_pool(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ifpool") / "pool.jsonl"
    io.write_jsonl(path, ifpool.generate(5, 1, "eval", "i", max_constraints=2))
    return path


def sample(policy, pool: Path, out: Path, shard: str | None = None) -> Path:
    """What `candidates sample [--shard]` writes, the policy loaded once for every shard."""
    params = candidates.full_params({**PARAMS, "seed": 3})
    prompts, first_batch = candidates.shard_of_pool(read_pool(pool), params, shard)
    rows = candidates.sample(prompts, *policy, "", params, first_batch=first_batch)
    candidates.write_samples(str(out), rows, params)
    return out


@pytest.fixture(scope="module")
def unsharded_samples(policy, math_pool, tmp_path_factory) -> Path:
    return sample(policy, math_pool, tmp_path_factory.mktemp("whole") / "samples.jsonl")


@pytest.mark.parametrize("n", SHARDS)
def test_merged_sample_shards_are_the_unsharded_samples_byte_for_byte(
    n, policy, math_pool, unsharded_samples, tmp_path
):
    out = tmp_path / "candidates/c/samples.jsonl"
    parts = paths.shards_of(str(out), n)
    for i, part in enumerate(parts):
        sample(policy, math_pool, Path(part), paths.shard_id(i, n))
    sizes = [manifest.require_file(p, "test")["rows"] for p in parts]
    assert (0 in sizes) == (n == 7)  # 5 batches: 7 shards leave two empty, valid parts
    candidates.main(["merge", "--parts", *parts, "--out", str(out)])
    assert out.read_bytes() == unsharded_samples.read_bytes()
    merged, whole = (io.read_json(manifest.sidecar(p)) for p in (out, unsharded_samples))
    assert {k: merged[k] for k in ("sha256", "rows", "params")} == {
        k: whole[k] for k in ("sha256", "rows", "params")
    }


def test_the_sample_command_writes_an_empty_shard_without_the_model(math_pool, tmp_path):
    out = tmp_path / "samples.shards/6-of-7.jsonl"
    args = ["sample", "--pool", str(math_pool), "--base-model", str(tmp_path / "no-model")]
    args += ["--params-json", json.dumps(PARAMS), "--out", str(out), "--shard", "6-of-7"]
    candidates.main(args)
    assert out.read_bytes() == b"" and manifest.require_file(out, "test")["rows"] == 0


def test_a_part_sampled_with_other_params_is_refused_naming_it(math_pool, tmp_path):
    parts = paths.shards_of(str(tmp_path / "samples.jsonl"), 2)
    for part, seed in zip(parts, (3, 4)):
        candidates.write_samples(part, [], candidates.full_params({**PARAMS, "seed": seed}))
    with pytest.raises(manifest.ManifestError, match=f"refused {parts[1]}: sampled with other"):
        candidates.merge_shards(parts, str(tmp_path / "samples.jsonl"))


READ_BATCH = 4  # 10 items: batches of 4, 4 and 2
READS = [
    ("greedy", {"temperature": 0.0, "max_new_tokens": 8}, 0),
    ("served", {"temperature": 0.8, "max_new_tokens": 8}, 1),
]


def read(policy, pool: Path, root: Path, shard: str | None = None) -> list[str]:
    """What `readout --plan (greedy r0, served r1) [--shard]` writes under `root`, the policy
    loaded once for every shard."""
    items, first_batch = readout.shard_items(read_pool(pool), shard, READ_BATCH, str(pool))
    outs = []
    for regime, decoding, rep in READS:
        out = str(root / f"{regime}.r{rep}.parquet")
        df = pd.DataFrame()  # a shard with no batch: an empty part, as the command writes
        if items:
            df = readout_rows.readout(
                items, *policy, "", decoding, 1000 * rep, READ_BATCH, "t", first_batch=first_batch
            )
            df.insert(0, "arm", "base")
            df["replicate"] = rep
        tokens = int(df["n_tokens"].sum()) if items else 0
        meta = {"regime": regime, "replicate": rep, "tokens": tokens, "seconds": 0.5}
        readout_file.write_readout(df, out if shard is None else paths.shard_of(out, shard), meta)
        outs.append(out)
    return outs


def same_readout(merged: str, whole: str) -> None:
    pd.testing.assert_frame_equal(
        readout_file.read_readout(merged), readout_file.read_readout(whole)
    )
    a, b = (pq.read_table(p) for p in (merged, whole))
    assert a.schema.remove_metadata() == b.schema.remove_metadata() and a.equals(b)
    ma, mb = (readout_file.readout_meta(p) for p in (merged, whole))
    varies = ("created_utc", "seconds")  # differ between any two runs
    assert {k: v for k, v in ma.items() if k not in varies} == {
        k: v for k, v in mb.items() if k not in varies
    }


@pytest.fixture(scope="module")
def whole_reads() -> dict:
    """The unsharded readouts of each pool, read once: {pool: their paths}."""
    return {}


@pytest.mark.parametrize(("pool", "n"), [("math", 1), ("math", 3), ("math", 7), ("if", 3)])
def test_merged_readout_shards_are_the_unsharded_readouts(
    n, pool, policy, whole_reads, request, tmp_path_factory, tmp_path
):
    name, pool = pool, request.getfixturevalue(f"{pool}_pool")
    if name not in whole_reads:
        whole_reads[name] = read(policy, pool, tmp_path_factory.mktemp("whole"))
    whole = whole_reads[name]
    for i in range(n):
        read(policy, pool, tmp_path / "sharded", paths.shard_id(i, n))
    plan = [{"out": str(tmp_path / "sharded" / Path(w).name)} for w in whole]
    readout_merge.main(["--plan", json.dumps(plan), "--shards", str(n)])
    for merged, w in zip(plan, whole):
        same_readout(merged["out"], w)


def test_the_readout_command_reads_its_shard_into_the_parts(math_pool, tmp_path):
    """The command line end to end: the plan's outputs become the shard's parts."""
    plan = [
        {"regime": g, "decoding": d, "replicate": r, "out": str(tmp_path / f"{g}.r{r}.parquet")}
        for g, d, r in READS
    ]
    args = ["readout", "--suite", "math", "--arm", "base", "--pool", str(math_pool)]
    args += ["--base-model", str(BASE), "--batch-size", str(READ_BATCH)]
    args += ["--plan", json.dumps(plan)]
    for shard in ("1-of-7", "6-of-7"):  # 3 batches: shard 1 holds one, shard 6 none
        readout.main([*args, "--shard", shard])
        for r in plan:
            meta = readout_file.readout_meta(paths.shard_of(r["out"], shard))
            df = pd.read_parquet(paths.shard_of(r["out"], shard))
            assert len(df) == (READ_BATCH if shard == "1-of-7" else 0)
            assert meta["seed"] == 1000 * r["replicate"] and meta["regime"] == r["regime"]
    assert not any(Path(r["out"]).exists() for r in plan)


def test_a_readout_part_of_another_decoding_is_refused_naming_it(tmp_path):
    out = str(tmp_path / "greedy.r0.parquet")
    for part, seed in zip(paths.shards_of(out, 2), (0, 99)):
        readout_file.write_readout(
            pd.DataFrame(), part, {"seed": seed, "tokens": 0, "seconds": 0.0}
        )
    with pytest.raises(manifest.ManifestError, match="1-of-2.parquet: its seed differ"):
        readout_merge.merge(out, 2)


def test_a_multi_turn_pool_is_not_sharded():
    turns = ifpool.conversations(2, 1, "eval", "t", 2)
    with pytest.raises(ValueError, match="pools/t.jsonl is a multi-turn pool"):
        readout.shard_items(turns, "0-of-2", 2, "pools/t.jsonl")


def budget_of(
    tmp_path: Path, shards: int, gpu_minutes: float = 1e9, suite_shards: int | None = None
) -> afbudget.Budget:
    """The embedded default's budget, corpus rft_r1 in `shards` shards, suite math in
    `suite_shards` (default: as many)."""
    arms = tmp_path / "arms"
    if not arms.exists():
        shutil.copytree(REPO / "config/arms", arms)
    over = tmp_path / f"shards{shards}-{suite_shards}.yaml"
    over.write_text(
        yaml.safe_dump(
            {
                "corpora": {"rft_r1": {"shards": shards}},
                "evals": {"math": {"shards": suite_shards or shards}},
                "budget": {"gpu_minutes": gpu_minutes},
            }
        )
    )
    raw, _ = afconfig.load_configs(
        [str(REPO / "tests/e2e/config.yaml"), str(over)],
        [f"results_dir={tmp_path / 'results'}", f"arms_dir={arms}"],
    )
    return afbudget.Budget(afconfig.resolve(raw))


def test_the_budget_charges_each_shard_job_its_overhead(tmp_path):
    one, three = budget_of(tmp_path, 1), budget_of(tmp_path, 3)
    over = one.est["overhead_minutes"]
    assert over > 0
    # the same batches in 3 one-GPU jobs: 2 more jobs' overhead, by the cost model's formula
    c = one.cfg["corpora"]["rft_r1"]
    prompts = one.pool_rows(c["pool"])
    decode = -(-prompts * c["k"] // c["batch_size"]) * c["max_new_tokens"]
    decode *= one.est["decode_step_seconds"] / 60
    assert one.sampling("rft_r1") == pytest.approx(decode + over)
    assert three.sampling("rft_r1") == pytest.approx(decode + 3 * over)
    assert three.sampling("rft_r2") == pytest.approx(one.sampling("rft_r2"))  # not sharded
    assert three.readout("math", "greedy") == pytest.approx(
        one.readout("math", "greedy") + 2 * over
    )
    reads = sum(1 for _ in one.readout_files("R220"))
    e1, e3 = one.estimate("R220"), three.estimate("R220")
    assert e3.readouts == pytest.approx(e1.readouts + reads * 2 * over)
    assert e3.sampling == pytest.approx(e1.sampling + 2 * over)


def test_admission_refuses_an_arm_whose_shards_overrun_the_cap(tmp_path):
    line = ["S1", "R220"]
    one = budget_of(tmp_path, 1)
    cap = one.cost(line) + one.settings["spent_gpu_minutes"] + 0.05  # fits them unsharded
    admitted = admission.admit(budget_of(tmp_path, 1, cap))
    assert {a for a in line if admitted[a]["status"] == admission.ADMITTED} == set(line)
    sharded = budget_of(tmp_path, 3, cap, suite_shards=1)  # S1's readouts cost as before
    decided = admission.admit(sharded)
    assert decided["S1"]["status"] == admission.ADMITTED
    assert decided["R220"]["status"] == admission.REFUSED
    over = sharded.est["overhead_minutes"]  # two more sampling jobs' start-up
    assert sharded.cost(line) == pytest.approx(one.cost(line) + 2 * over)
    with pytest.raises(afbudget.BudgetError, match="arm 'R220' would overrun the budget"):
        sharded.check(line, "R220")


def test_a_sharded_suite_on_a_multi_turn_pool_is_refused_naming_the_key():
    cfg = yaml.safe_load((REPO / "config/config.yaml").read_text())
    cfg["pools"]["if_turns"] = {"kind": "ifeval", "n": 40, "seed": 0, "split": "eval", "turns": 4}
    cfg["evals"]["turns"] = {"pool": "if_turns", "shards": 2, "regimes": {"greedy": {}}}
    with pytest.raises(afconfig.ConfigError, match=r"key 'evals/turns/shards'.*multi-turn"):
        afconfig.resolve(cfg, repo_root=REPO, config_file="config/config.yaml")
    cfg["evals"]["turns"]["shards"] = 1
    assert afconfig.resolve(cfg, repo_root=REPO, config_file="c")["evals"]["turns"]["shards"] == 1
