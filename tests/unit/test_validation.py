"""Validation refuses a bad value before anything runs on it, naming the file and the row or key:
out-of-range numbers in the config and arm files (the schemas' bounds), an empty pool (at its
build, where a stage reads it, and while the DAG is built), a prompt longer than the pool's
max_prompt_chars, and verdicts short of k samples for a prompt."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from dagrun import dry_run, planned_jobs
from test_corpora import POOL, fake_samples, fake_verdicts, params

from arenaflow import config, io, schema
from arenaflow.corpora import build as corpora
from arenaflow.dag import stages
from arenaflow.evals import readout
from arenaflow.pools import build as pools
from arenaflow.pools import validate as pool_rows

CONFIG_FILE = "config/config.yaml"
# (config files merged in order): every config the project ships or tests run on
SHIPPED = [
    ["config/config.yaml"],
    ["config/smollm2.yaml"],
    ["config/smollm2-gpu.yaml"],
    ["config/seeds/002.yaml"],
    ["config/seeds/002.yaml", "config/seeds/002-gpu.yaml"],
    ["config/seeds/003.yaml"],
    ["config/seeds/003.yaml", "config/seeds/003-gpu.yaml"],
    ["config/examples/own-model.yaml"],
    ["tests/e2e/config.yaml"],
    ["tests/e2e/mini.yaml"],
    ["config/seeds/002.yaml", "tests/e2e/seed002.yaml"],
    ["tests/e2e/smollm2.yaml"],
]


@pytest.fixture
def cfg(repo_root):
    return yaml.safe_load((repo_root / CONFIG_FILE).read_text())


def refused(cfg, repo_root) -> str:
    with pytest.raises(config.ConfigError) as e:
        config.resolve(cfg, repo_root=repo_root, config_file=CONFIG_FILE)
    return str(e.value)


# --- every number has a range -------------------------------------------------------------


def _bar(**clause):
    return lambda c: c["rounds"]["r3"]["bar"].append({"op": ">", **clause})


def _set(*keys, value):
    def edit(c):
        node = c
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return edit


# (edit of config.yaml, the key the error names, how the bound reads)
OUT_OF_RANGE = {
    "delta above 100 points": (
        _bar(metric="delta", value=150),
        "rounds/r3/bar/2/value",
        "maximum of 100",
    ),
    "p_value above 1": (_bar(metric="p_value", value=5), "rounds/r3/bar/2/value", "maximum of 1"),
    "accuracy level below 0": (
        _bar(metric="accuracy", value=-5),
        "rounds/r3/bar/2/value",
        "minimum of 0",
    ),
    "loop_rate difference below -100": (
        _bar(metric="loop_rate", vs="incumbent", value=-101),
        "rounds/r3/bar/2/value",
        "minimum of -100",
    ),
    "mean_words level below 0": (
        _bar(metric="mean_words", value=-1),
        "rounds/r3/bar/2/value",
        "minimum of 0",
    ),
    "noise times 1000": (
        _bar(metric="delta", noise={"stat": "spread", "times": 1000}),
        "rounds/r3/bar/2/noise/times",
        "maximum of 10",
    ),
    "a template's bar": (
        _set("continual", "bar", value=[{"metric": "p_value", "op": "<", "value": 5}]),
        "continual/bar/0/value",
        "maximum of 1",
    ),
    "a template corpus's temperature": (
        _set("continual", "corpus", "temperature", value=-1),
        "continual/corpus/temperature",
        "minimum of 0",
    ),
    "a negative judged seed": (
        _set("judged", "B3_vs_R2d", "seed", value=-1),
        "judged/B3_vs_R2d/seed",
        "minimum of 0",
    ),
    "an lr of 5": (_set("train_defaults", "lr", value=5), "train_defaults/lr", "maximum of 1"),
    "dropout 1": (
        _set("train_defaults", "lora", "dropout", value=1.0),
        "train_defaults/lora/dropout",
        "maximum of 1",
    ),
    "a 40-bit seed": (
        _set("train_defaults", "seed", value=2**40),
        "train_defaults/seed",
        "maximum of 4294967295",
    ),
    "max_prompt_chars 0": (
        _set("pools", "math_eval", "max_prompt_chars", value=0),
        "pools/math_eval/max_prompt_chars",
        "minimum of 1",
    ),
}


@pytest.mark.parametrize("case", OUT_OF_RANGE)
def test_an_out_of_range_number_is_refused_naming_its_key(case, cfg, repo_root):
    edit, key, bound = OUT_OF_RANGE[case]
    edit(cfg)
    msg = refused(cfg, repo_root)
    assert msg.startswith(f"{CONFIG_FILE}: key '{key}': ") and bound in msg, msg


@pytest.mark.parametrize(
    "arm, body, key",
    [
        ("soup", {"merge": {"of": {"B3": 0.5, "B2": 100}}}, "merge/of/B2"),
        ("dose", {"dose": {"from": "R2d", "to": "B3", "alpha": 50}}, "dose/alpha"),
        ("dose", {"dose": {"from": "R2d", "to": "B3", "alpha": [0.5, -50]}}, "dose/alpha"),
    ],
)
def test_an_arm_s_weight_or_alpha_out_of_range_is_refused(arm, body, key, cfg, repo_root, tmp_path):
    arms = tmp_path / "arms"
    shutil.copytree(repo_root / "config/arms", arms)
    (arms / f"{arm}.yaml").write_text(yaml.safe_dump(body))
    cfg["arms_dir"] = str(arms)
    msg = refused(cfg, repo_root)
    assert f"{arms / arm}.yaml" in msg and f"key '{key}" in msg, msg


def test_a_difference_may_be_negative_where_a_level_may_not(cfg, repo_root):
    """vs makes a level metric a difference: -5 points against the incumbent is a threshold."""
    _bar(metric="accuracy", vs="incumbent", value=-5)(cfg)
    _bar(metric="mean_words", vs="control", value=-20)(cfg)
    cfg["rounds"]["r3"]["control"] = "R2d"
    bar = config.resolve(cfg, repo_root=repo_root, config_file=CONFIG_FILE)["rounds"]["r3"]["bar"]
    assert [c["value"] for c in bar[-2:]] == [-5, -20]


def _numbers(node, path=()):
    """(path, schema) of every number or integer schema in a schema, however deep."""
    if isinstance(node, dict):
        types = node.get("type")
        types = types if isinstance(types, list) else [types]
        if {"number", "integer"} & set(types):
            yield path, node
        for k, v in node.items():
            yield from _numbers(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numbers(v, (*path, i))


def test_every_number_of_both_schemas_has_a_lower_bound():
    """A bar's `value` alone takes its bounds from its metric (an if/then per metric)."""
    cfg_schema, arm_schema, _ = schema.schemas(schema.SCHEMA_DIR)
    unbounded = [
        "/".join(map(str, p))
        for doc in (cfg_schema, arm_schema)
        for p, node in _numbers(doc)
        if not {"minimum", "exclusiveMinimum"} & set(node) and p[-2:] != ("properties", "value")
    ]
    assert unbounded == [], unbounded


@pytest.mark.parametrize("files", SHIPPED, ids=["+".join(f) for f in SHIPPED])
def test_every_shipped_config_and_its_arms_are_within_range(files, repo_root):
    cfg_schema, arm_schema, registry = schema.schemas(schema.SCHEMA_DIR)
    raw, _ = config.load_configs([repo_root / f for f in files])
    schema.validate(raw, cfg_schema, registry, " + ".join(files))
    dirs = [raw["arms_dir"], *([raw["continual"]["arms_dir"]] if "continual" in raw else [])]
    for path in sorted(p for d in dirs for p in (repo_root / d).glob("*.yaml")):
        schema.validate(schema.load_yaml(path), arm_schema, registry, str(path))


# --- an empty pool ------------------------------------------------------------------------


def test_a_pool_built_with_no_rows_is_refused():
    with pytest.raises(ValueError, match=r"^pools/p\.jsonl: no rows"):
        pool_rows.validate_rows([], "pools/p.jsonl")


@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["zero-bytes", "blank-lines"])
def test_a_stage_refuses_an_empty_pool_naming_it(content, tmp_path):
    path = tmp_path / "pools/math_eval.jsonl"
    path.parent.mkdir()
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: no rows"):
        pool_rows.read_pool(path)


def test_the_dag_refuses_an_empty_built_pool_before_any_job(tmp_path, repo_root):
    raw, files = config.load_configs([repo_root / CONFIG_FILE])
    cfg = config.resolve(raw, repo_root=repo_root, config_file=CONFIG_FILE, sources=files)
    (tmp_path / "pools").mkdir()
    stages.refuse_empty_pools(cfg, tmp_path)  # nothing built yet: nothing to refuse
    io.write_jsonl(tmp_path / "pools/sft_s1.jsonl", POOL)
    (tmp_path / "pools/math_eval.jsonl").write_bytes(b"")
    empty = re.escape(str(tmp_path / "pools/math_eval.jsonl"))
    with pytest.raises(ValueError, match=rf"^{empty}: no rows"):
        stages.refuse_empty_pools(cfg, tmp_path)


def test_an_empty_eval_pool_stops_the_corpus_build_and_writes_nothing(tmp_path, repo_root):
    """Fault: the eval pool emptied after it was built. Refused: the corpus job names the pool
    and writes no corpus, so no arm trains on one."""
    pool, empty, out = tmp_path / "pool.jsonl", tmp_path / "math_eval.jsonl", tmp_path / "corpus"
    io.write_jsonl(pool, POOL)
    empty.write_bytes(b"")
    argv = [
        "--corpus",
        "c",
        "--pool",
        str(pool),
        "--tokenizer",
        str(repo_root / "models/tiny-arith"),
    ]
    argv += ["--params-json", "{}", "--eval-pools", str(empty), "--out", str(out)]
    with pytest.raises(ValueError, match=rf"^{re.escape(str(empty))}: no rows"):
        corpora.main(argv)
    assert not out.exists()


def test_a_readout_of_an_empty_pool_is_refused_and_writes_nothing(tmp_path, repo_root):
    """Where an empty eval pool used to fail (a KeyError past every corpus and arm): the readout
    names the pool and writes no readout."""
    empty, out = tmp_path / "math_eval.jsonl", tmp_path / "greedy.r0.parquet"
    empty.write_bytes(b"")
    argv = ["readout", "--suite", "math", "--arm", "base", "--pool", str(empty), "--base-model"]
    argv += [str(repo_root / "models/tiny-arith"), "--regime-json", '{"temperature": 0.0}']
    with pytest.raises(ValueError, match=rf"^{re.escape(str(empty))}: no rows"):
        readout.main([*argv, "--out", str(out)])
    assert not out.exists()


def test_snakemake_refuses_an_empty_pool_before_planning_any_job(tmp_path, repo_root):
    """Fault: results/pools/math_eval.jsonl emptied in place. Refused: the dry run names the
    file and plans nothing (no corpus is rebuilt, no arm retrained before a readout fails)."""
    results, arms = tmp_path / "results", tmp_path / "arms"
    shutil.copytree(repo_root / "config/arms", arms)
    (results / "pools").mkdir(parents=True)
    (results / "pools/math_eval.jsonl").write_bytes(b"")
    proc = subprocess.run(
        dry_run(results=results, arms=arms), cwd=repo_root, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert f"{results}/pools/math_eval.jsonl: no rows" in proc.stdout + proc.stderr
    assert planned_jobs(proc) == []


# --- an oversized prompt ------------------------------------------------------------------


def _open_pool(tmp_path, prompts: list[str]):
    f = tmp_path / "prompts.jsonl"
    io.write_jsonl(f, [{"prompt": p} for p in prompts])
    return f


def test_a_prompt_over_max_prompt_chars_is_refused_naming_file_line_and_key(tmp_path):
    f = _open_pool(tmp_path, ["a short one", "x" * 200_000])
    with pytest.raises(ValueError) as e:
        pools.build("big", {"kind": "open", "file": str(f)})
    msg = str(e.value)
    assert msg.startswith(f"{f}:2: the prompt is 200000 characters") and (
        "pools/big/max_prompt_chars = 32768" in msg
    ), msg
    # the key decides: raised above the row, the same file builds
    assert (
        len(pools.build("big", {"kind": "open", "file": str(f), "max_prompt_chars": 200_000})) == 2
    )


def test_a_chat_row_s_earlier_turns_count_toward_its_length(tmp_path):
    f = tmp_path / "chat.jsonl"
    turns = ["u" * 60, "a" * 60, "u" * 30, "a" * 10]
    roles = ["user", "assistant", "user", "assistant"]
    io.write_jsonl(f, [{"messages": [{"role": r, "content": t} for r, t in zip(roles, turns)]}])
    within = {"kind": "chat", "file": str(f), "max_prompt_chars": 150}
    assert len(pools.build("c", within)) == 1  # 60 + 60 + 30 characters
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(f))}:1: the prompt is 150 characters .* = 149;"
    ):
        pools.build("c", {**within, "max_prompt_chars": 149})


def test_the_pool_command_refuses_an_oversized_prompt_and_writes_no_pool(tmp_path):
    """Fault: a 200 KB prompt in an imported pool's file. Refused: the pool build names the file,
    the line and the key, and writes no pool for anything downstream to read."""
    f, out = _open_pool(tmp_path, ["x" * 200_000]), tmp_path / "pools/big.jsonl"
    params = json.dumps({"kind": "open", "file": str(f)})
    cmd = [sys.executable, "-m", "arenaflow.pools.build", "--pool", "big"]
    proc = subprocess.run(
        [*cmd, "--params-json", params, "--out", str(out)], capture_output=True, text=True
    )
    assert proc.returncode != 0 and not out.exists()
    assert f"{f}:1: the prompt is 200000 characters" in proc.stderr
    assert "pools/big/max_prompt_chars" in proc.stderr


# --- verdicts short of k ------------------------------------------------------------------


def test_a_deleted_verdict_names_the_verdicts_file_and_the_prompt():
    samples = fake_samples()
    verdicts = [v for v in fake_verdicts(samples) if v["id"] != "p2#3"]
    with pytest.raises(ValueError) as e:
        corpora.select(POOL, samples, verdicts, params(), "candidates/c/verdicts.jsonl")
    msg = str(e.value)
    assert msg.startswith("candidates/c/verdicts.jsonl: prompt 'p2' has 3 verdict(s)"), msg
    assert "fewer than k = 4" in msg


def test_the_corpus_command_names_the_verdicts_file_it_read(tmp_path, repo_root):
    samples = fake_samples()
    files = {n: tmp_path / f"{n}.jsonl" for n in ("pool", "samples", "verdicts")}
    io.write_jsonl(files["pool"], POOL)
    io.write_jsonl(files["samples"], samples)
    io.write_jsonl(files["verdicts"], [v for v in fake_verdicts(samples) if v["id"] != "p1#0"])
    argv = [f"--{n}={p}" for n, p in files.items()]
    argv += ["--corpus", "c", "--tokenizer", str(repo_root / "models/tiny-arith")]
    argv += ["--params-json", json.dumps(params()), "--out", str(tmp_path / "c")]
    shown = re.escape(str(files["verdicts"]))
    with pytest.raises(
        ValueError, match=rf"^{shown}: prompt 'p1' has 3 verdict\(s\), fewer than k"
    ):
        corpora.main(argv)
    assert not (tmp_path / "c").exists()
