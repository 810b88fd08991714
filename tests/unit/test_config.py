"""arenaflow.config: the shipped config resolves; every error names the file and the key."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from arenaflow import chatformat, config, schema
from arenaflow.config import ConfigError
from arenaflow.config import __main__ as config_cli

CONFIG_FILE = "config/config.yaml"


@pytest.fixture(scope="module")
def raw_cfg(repo_root):
    return yaml.safe_load((repo_root / CONFIG_FILE).read_text())


@pytest.fixture(scope="module")
def resolved(raw_cfg, repo_root):
    return config.resolve(copy.deepcopy(raw_cfg), repo_root=repo_root, config_file=CONFIG_FILE)


@pytest.fixture
def cfg(raw_cfg):
    return copy.deepcopy(raw_cfg)


@pytest.fixture
def arms_copy(tmp_path, repo_root, cfg):
    """A writable copy of config/arms, with cfg['arms_dir'] pointing at it (absolute)."""
    d = tmp_path / "arms"
    shutil.copytree(repo_root / "config" / "arms", d)
    cfg["arms_dir"] = str(d)
    return d


def edit_arm(arms_dir: Path, arm: str, **changes) -> Path:
    path = arms_dir / f"{arm}.yaml"
    data = yaml.safe_load(path.read_text())
    for k, v in changes.items():
        data[k] = v
    path.write_text(yaml.safe_dump(data))
    return path


def resolve(cfg, repo_root):
    return config.resolve(cfg, repo_root=repo_root, config_file=CONFIG_FILE)


# --- the shipped config -------------------------------------------------------------------


def test_shipped_config_resolves_every_arm_file(resolved, repo_root):
    stems = {p.stem for p in (repo_root / "config" / "arms").glob("*.yaml")}
    doses = {"dose-a0p5", "dose-a1p5", "dose-a2"}  # dose.yaml's alpha: [0.5, 1.5, 2.0]
    grid = {p.stem for p in (repo_root / "config" / "continual").glob("*.yaml")}
    continual = {f"{r}-{a}" for r in ("r4", "r5") for a in grid}  # config.yaml's continual: r3 + 2
    nominees = {"r3-nominee", "r4-nominee"}  # what r4 and r5 continue
    assert set(resolved["arms"]) == stems - {"dose"} | doses | continual | nominees
    for arm, a in resolved["arms"].items():
        if arm in nominees:
            assert a["kind"] == "nominee" and a["file"] == CONFIG_FILE
            continue
        where = (
            ("continual", arm.split("-", 1)[1])
            if arm in continual
            else ("arms", "dose" if arm in doses else arm)
        )
        assert Path(a["file"]) == repo_root / "config" / where[0] / f"{where[1]}.yaml"


@pytest.mark.parametrize(
    "path",
    sorted((Path(__file__).resolve().parents[2] / "config" / "arms").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_every_arm_file_validates_against_the_arm_schema(path, repo_root):
    schema = yaml.safe_load((repo_root / "workflow" / "schemas" / "arm.schema.yaml").read_text())
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(path.read_text()))


def test_lineage_of_b3_is_r2d_r220_s1(resolved):
    lineage = resolved["arms"]["B3"]["lineage"]
    assert sorted(lineage) == sorted(["R2d", "R220", "S1"])
    assert len(lineage) == 3


def test_lineage_follows_init_and_corpus_policy(resolved):
    arms = resolved["arms"]
    assert arms["S1"]["lineage"] == []  # init base, corpus policy reference
    assert arms["R220"]["lineage"] == ["S1"]
    assert sorted(arms["R2d"]["lineage"]) == ["R220", "S1"]
    for b in ("B1", "B2", "B4"):
        assert sorted(arms[b]["lineage"]) == ["R220", "R2d", "S1"]


def test_arm_hyper_overrides_train_defaults_and_keeps_the_rest(resolved, raw_cfg):
    defaults = raw_cfg["train_defaults"]
    b1 = resolved["arms"]["B1"]["hyper"]
    assert b1["lr"] == 5.0e-4
    assert b1["lora"] == defaults["lora"]
    assert b1["epochs"] == defaults["epochs"]
    s1 = resolved["arms"]["S1"]["hyper"]
    assert (s1["lr"], s1["epochs"]) == (2.0e-3, 2)
    assert s1["micro_batch_size"] == defaults["micro_batch_size"]


# The defaults the code used before arm.schema.yaml held them (train/loop.py DEFAULTS, budget.py's
# .get(..., 1), config.py's objective 'sft'), and config.yaml's train_defaults as a minimal arm
# resolved to before arm.schema.yaml held the defaults.
CODE_DEFAULTS = {
    "objective": "sft",
    "beta": 0.1,
    "nll_weight": 0.0,
    "simpo_gamma": 0.5,
    "packing": False,
    "max_steps": None,
    "lm_head_lr": None,
    "checkpoint_every": 0,
    "zero3_persistence_threshold": 100000,
    "zero_stage": "auto",  # stage 3 on several ranks, 2 on one (train/dist.py)
    "length_bucketing": True,
    "zero3_leaf_modules": "auto",
    "fused_lora": True,
    "grouped_lora": False,
    "fused_kernels": "auto",  # compiled when the steps pay it back (arenaflow.fused)
    "precision": "auto",  # bf16 on GPUs, fp32 on CPU (train/dist.py bf16)
    "nproc": 1,
    "nodes": 1,
    "epochs": 1,
    "heldout_rows": 0,  # no held-out rows unless an arm asks
    "heldout_every": 0,
}
MINIMAL_ARM_HYPER = {
    "method": "lora",
    "lr": 0.001,
    "weight_decay": 0.0,
    "warmup_ratio": 0.02,
    "min_lr_ratio": 0.01,
    "max_grad_norm": 1.0,
    "epochs": 1,
    "micro_batch_size": 16,
    "grad_accum": 2,
    "seq_len": 256,
    "seed": 0,
    "nproc": 1,
    "runtime_min": 30,
    "mem_mb": 4000,
    "checkpoint_every": 0,
    "lora": {
        "r": 8,
        "alpha": 16,
        "dropout": 0.0,
        "target_modules": [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
    },
}


def test_every_hyper_default_the_code_reads_is_the_schemas():
    assert schema.hyper_defaults() == CODE_DEFAULTS
    for key, value in CODE_DEFAULTS.items():
        arm_schema = yaml.safe_load((schema.SCHEMA_DIR / "arm.schema.yaml").read_text())
        assert arm_schema["$defs"]["hyper"]["properties"][key]["default"] == value, key


def test_the_trainer_and_the_budget_fill_a_missing_key_from_the_schema():
    from arenaflow.budget import cost as budget
    from arenaflow.train import loop

    assert not hasattr(loop, "DEFAULTS")
    h = {"micro_batch_size": 2, "grad_accum": 1}
    assert budget.gpus({}) == 1 and budget.train_steps(10, h) == 5
    assert budget.train_steps(10, {**h, "max_steps": 3, "nproc": 1}) == 3


def test_a_minimal_arm_resolves_to_train_defaults_over_the_schema_s(cfg, arms_copy, repo_root):
    """Resolution fills an arm's hyper whole, once: the schema's defaults, train_defaults over
    them; the training job's params are that hyper but the scheduler's keys, as sorted JSON."""
    (arms_copy / "M.yaml").write_text("init: base\ncorpus: sft_s1\n")
    res = config.resolve(cfg, repo_root=repo_root, config_file=CONFIG_FILE)
    assert res["arms"]["M"]["hyper"] == {**CODE_DEFAULTS, **MINIMAL_ARM_HYPER}
    params = json.loads(res["arms"]["M"]["params_json"])
    assert params == {
        k: v for k, v in res["arms"]["M"]["hyper"].items() if k not in schema.RUN_KEYS
    }
    assert res["arms"]["M"]["params_json"] == json.dumps(
        params, sort_keys=True, separators=(",", ":")
    )


def test_corpus_defaults_are_filled_from_the_schema(resolved):
    sft = resolved["corpora"]["sft_s1"]
    assert (sft["k"], sft["select"], sft["min_chars"], sft["seed"]) == (4, "median", 0, 0)
    assert resolved["corpora"]["rft_r1"]["max_new_tokens"] == 48  # given values are kept


def test_suite_judged_and_budget_defaults_are_filled_from_the_schema(cfg, repo_root):
    cfg["budget"] = {"gpu_minutes": 5, "estimate": {"row_seconds": 2.0}}
    res = resolve(cfg, repo_root)
    suite = res["evals"]["math"]
    assert {k: suite[k] for k in schema.schema_defaults("suite")} == {
        "replicates": 1,
        "seed": 0,
        "batch_size": 256,
        "shards": 1,
    }
    assert (
        suite["regimes"]["served"]["replicates"] == 3
        and suite["regimes"]["greedy"]["replicates"] == 1
    )
    assert res["judged"]["B3_vs_R2d"]["replicate"] == 0
    assert res["budget"] == {
        "gpu_minutes": 5,
        "spent_gpu_minutes": 0,
        "history": ["runs/*/final/training_evidence.json"],
        "estimate": {"row_seconds": 2.0, "decode_step_seconds": 0.05, "overhead_minutes": 1.0},
    }
    assert all(a["priority"] == 1 for a in res["arms"].values())  # arm.schema.yaml's default


def test_rule_params_get_no_schema_default_written_into_them(resolved):
    # a pool, a regime's decoding: filling them would rerun finished jobs
    assert "kind" not in resolved["pools"]["math_eval"]
    assert set(resolved["evals"]["math"]["regimes"]["greedy"]) == {
        "temperature",
        "max_new_tokens",
        "replicates",
    }
    assert schema.decoding_of(resolved["evals"]["math"]["regimes"]["greedy"]) == {
        "temperature": 0.0,
        "top_p": 1.0,
        "max_new_tokens": 48,
        "repetition_penalty": 1.0,
    }


def test_relative_base_path_is_made_absolute_under_repo_root(resolved, repo_root):
    assert resolved["base"]["path"] == str(repo_root / "models" / "tiny-arith")


def test_resolve_does_not_mutate_its_input(raw_cfg, repo_root):
    before = copy.deepcopy(raw_cfg)
    resolve(raw_cfg, repo_root)
    assert raw_cfg == before


def test_merge_is_deep_for_dicts_and_replaces_lists():
    base = {"lora": {"r": 8, "alpha": 16, "target_modules": ["q", "k"]}, "lr": 1}
    out = schema.merge(base, {"lora": {"r": 4, "target_modules": ["v"]}})
    assert out == {"lora": {"r": 4, "alpha": 16, "target_modules": ["v"]}, "lr": 1}
    assert base["lora"]["r"] == 8


# --- errors in arm files ------------------------------------------------------------------


def assert_names(err: ConfigError, file: Path | str, key: str):
    msg = str(err)
    assert str(file) in msg, msg
    assert re.search(rf"key '{re.escape(key)}'", msg) or f"'{key}'" in msg, msg


def test_negative_lr_names_file_and_key(cfg, arms_copy, repo_root):
    path = edit_arm(arms_copy, "B2", hyper={"lr": -1.0e-4})
    with pytest.raises(ConfigError) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, path, "hyper/lr")


def test_an_id_too_long_for_a_path_is_refused_before_any_job(cfg, arms_copy, repo_root):
    """A 240-character bundle id failed late, on a temporary path; an arm file's name too."""
    cfg["bundles"]["b" * 240] = cfg["bundles"].pop("B3f")
    with pytest.raises(ConfigError, match="is too long") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "bundles")
    cfg["bundles"]["B3f"] = cfg["bundles"].pop("b" * 240)
    long_arm = arms_copy / f"{'a' * 101}.yaml"
    long_arm.write_text((arms_copy / "B2.yaml").read_text())
    with pytest.raises(ConfigError, match="is too long") as e:
        resolve(cfg, repo_root)
    assert f"{long_arm}: file name" in str(e.value)
    long_arm.rename(arms_copy / f"{'a' * 100}.yaml")  # the longest an id may be
    assert "a" * 100 in resolve(cfg, repo_root)["arms"]


@pytest.mark.parametrize("text", [".nan", ".inf", "-.inf"])
def test_a_non_finite_number_names_its_file_and_key(cfg, arms_copy, repo_root, text):
    """YAML's .nan and .inf are numbers to JSON Schema (a NaN lr trained to "diverged", a NaN
    serving temperature shipped as `NaN`, which is not JSON): refused, in an arm file and in
    the config, naming the key."""
    value = yaml.safe_load(text)
    path = edit_arm(arms_copy, "B2", hyper={"lr": value})
    assert f"lr: {text}" in path.read_text()  # as a user writes it
    with pytest.raises(ConfigError, match="is not a finite number") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, path, "hyper/lr")
    edit_arm(arms_copy, "B2", hyper={"lr": 2.5e-4})
    cfg["bundles"]["B3f"]["serving"]["temperature"] = value
    with pytest.raises(ConfigError, match="is not a finite number") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "bundles/B3f/serving/temperature")


def test_grouped_lora_without_fused_lora_names_file_and_key(cfg, arms_copy, repo_root):
    path = edit_arm(arms_copy, "B2", hyper={"grouped_lora": True, "fused_lora": False})
    with pytest.raises(ConfigError, match="needs fused_lora") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, path, "hyper/grouped_lora")


def test_unknown_key_in_arm_file_names_file_and_key(cfg, arms_copy, repo_root):
    path = edit_arm(arms_copy, "B4", learning_rate=0.1)
    with pytest.raises(ConfigError, match="Additional properties") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, path, "learning_rate")


def test_unknown_nested_hyper_key_names_file_and_key(cfg, arms_copy, repo_root):
    path = edit_arm(arms_copy, "B1", hyper={"lr": 1e-3, "lora": {"rank": 8}})
    with pytest.raises(ConfigError) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, path, "hyper/lora")
    assert "rank" in str(e.value)


def test_init_naming_a_missing_arm_names_file_and_key(cfg, arms_copy, repo_root):
    path = edit_arm(arms_copy, "B3", init="R9")
    with pytest.raises(ConfigError, match="'R9'") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, path, "init")


def test_unknown_corpus_in_arm_names_file_and_key(cfg, arms_copy, repo_root):
    path = edit_arm(arms_copy, "B3", corpus="rft_r9")
    with pytest.raises(ConfigError, match="rft_r9") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, path, "corpus")


def test_init_cycle_names_the_file_and_key_closing_it(cfg, arms_copy, repo_root):
    # R220 is initialised from S1; make S1 initialised from R220
    path = edit_arm(arms_copy, "S1", init="R220")
    with pytest.raises(ConfigError, match="lineage cycle") as e:
        resolve(cfg, repo_root)
    msg = str(e.value)
    assert_names(e.value, path, "init")
    assert re.search(r"(R220 -> S1 -> R220|S1 -> R220 -> S1)", msg), msg
    assert "B1" not in msg  # an arm outside the cycle is not blamed


def test_corpus_policy_cycle_names_file_and_key(cfg, arms_copy, repo_root):
    # R220 trains on rft_r1; let rft_r1 be sampled by R2d, which descends from R220
    cfg["corpora"]["rft_r1"]["policy"] = "R2d"
    with pytest.raises(ConfigError, match="lineage cycle") as e:
        resolve(cfg, repo_root)
    msg = str(e.value)
    assert re.search(r"(R2d|R220)\.yaml: key '(init|corpus)'", msg), msg
    assert re.search(r"(R220 -> R2d -> R220|R2d -> R220 -> R2d)", msg), msg


@pytest.mark.parametrize("name", ["base", "reference"])
def test_reserved_names_cannot_name_an_arm(cfg, arms_copy, repo_root, name):
    shutil.copy(arms_copy / "B1.yaml", arms_copy / f"{name}.yaml")
    with pytest.raises(ConfigError, match="reserved") as e:
        resolve(cfg, repo_root)
    assert f"{name}.yaml" in str(e.value)


def test_arm_file_name_with_a_dot_is_rejected(cfg, arms_copy, repo_root):
    shutil.copy(arms_copy / "B1.yaml", arms_copy / "B1.5.yaml")
    with pytest.raises(ConfigError) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, arms_copy / "B1.5.yaml", "id")


def test_empty_arms_dir_is_an_error(cfg, tmp_path, repo_root):
    (tmp_path / "none").mkdir()
    cfg["arms_dir"] = str(tmp_path / "none")
    with pytest.raises(ConfigError, match="no <arm>.yaml"):
        resolve(cfg, repo_root)


# --- errors in config.yaml ----------------------------------------------------------------


def test_corpus_with_k_zero_names_file_and_key(cfg, repo_root):
    cfg["corpora"]["rft_r2"]["k"] = 0
    with pytest.raises(ConfigError) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "corpora/rft_r2/k")


@pytest.mark.parametrize("section", ["corpora/rft_r2", "evals/math"])
def test_an_unknown_decoder_or_engine_key_names_file_and_key(cfg, repo_root, section):
    kind, name = section.split("/")
    cfg[kind][name]["engine"] = {"decoder": "sglang"}
    with pytest.raises(ConfigError, match="'hf', 'static'") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, f"{section}/engine/decoder")
    cfg[kind][name]["engine"] = {"decode_path": "llama"}
    with pytest.raises(ConfigError, match="decode_path") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, f"{section}/engine")


def test_engine_settings_resolve_once_the_configs_then_a_suites_corpus_or_arms_over_them(
    cfg, repo_root, tmp_path
):
    """Every job's engine settings come out of resolution whole: the schema's defaults, the
    config's `engine:` over them, a suite's, corpus's or trained arm's own over those."""
    cfg["engine"] = {"decoder": "static", "decode_warmup": False}
    cfg["evals"]["math"]["engine"] = {"decoder": "hf"}
    cfg["corpora"]["rft_r2"]["engine"] = {"fused_decode": True}
    arms = tmp_path / "arms"
    shutil.copytree(repo_root / "config/arms", arms)
    with (arms / "B3.yaml").open("a") as f:
        f.write("engine: {train_warmup: false}\n")
    cfg["arms_dir"] = str(arms)
    res = resolve(cfg, repo_root)
    top = {**schema.schema_defaults("engine"), "decoder": "static", "decode_warmup": False}
    assert res["engine"] == top
    assert res["evals"]["math"]["engine"] == {**top, "decoder": "hf"}
    assert res["corpora"]["rft_r2"]["engine"] == {**top, "fused_decode": True}
    assert res["corpora"]["rft_r1"]["engine"] == top
    assert res["arms"]["B3"]["engine"] == {**top, "train_warmup": False}
    assert res["arms"]["B2"]["engine"] == top
    # a corpus's sampling param carries its settings: a change resamples it
    assert '"fused_decode":true' in schema.sampling_params(res["corpora"]["rft_r2"])


def test_unknown_top_level_key_names_file_and_key(cfg, repo_root):
    cfg["result_dir"] = "typo"
    with pytest.raises(ConfigError, match="Additional properties") as e:
        resolve(cfg, repo_root)
    assert CONFIG_FILE in str(e.value) and "result_dir" in str(e.value)


@pytest.mark.parametrize(
    "mutate, key, bad",
    [
        (lambda c: c["pools"].__setitem__("math.r9", c["pools"]["math_r1"]), "pools", "math.r9"),
        (
            lambda c: c["corpora"].__setitem__("rft/r9", dict(c["corpora"]["rft_r1"])),
            "corpora",
            "rft/r9",
        ),
        (
            lambda c: c["corpora"]["rft_r1"].__setitem__("pool", "../math_r1"),
            "corpora/rft_r1/pool",
            "../math_r1",
        ),
        (lambda c: c["rounds"]["r3"]["candidates"].append("B/5"), "rounds/r3/candidates/8", "B/5"),
        (lambda c: c["bundles"].__setitem__("B3.f", c["bundles"]["B3f"]), "bundles", "B3.f"),
    ],
    ids=["pool-dot", "corpus-slash", "pool-ref-path", "candidate-slash", "bundle-dot"],
)
def test_ids_with_dots_or_slashes_name_file_and_key(cfg, repo_root, mutate, key, bad):
    mutate(cfg)
    with pytest.raises(ConfigError) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, key)
    assert bad in str(e.value)


def test_unknown_pool_of_a_corpus_names_the_key(cfg, repo_root):
    cfg["corpora"]["rft_r1"]["pool"] = "math_r9"
    with pytest.raises(ConfigError, match="math_r9") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "corpora/rft_r1/pool")


def test_unknown_policy_of_a_corpus_names_the_key(cfg, repo_root):
    cfg["corpora"]["rft_r1"]["policy"] = "Z9"
    with pytest.raises(ConfigError, match="Z9") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "corpora/rft_r1/policy")


def test_training_on_an_eval_pool_is_refused(cfg, repo_root):
    cfg["corpora"]["rft_r1"]["pool"] = "math_eval"
    with pytest.raises(ConfigError, match="evaluation pool") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "corpora/rft_r1/pool")


def test_unknown_round_candidate_names_the_key(cfg, repo_root):
    cfg["rounds"]["r3"]["candidates"] = ["B1", "B7"]
    with pytest.raises(ConfigError, match="B7") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "rounds/r3/candidates/1")


def test_unknown_regime_names_the_key(cfg, repo_root):
    cfg["rounds"]["r3"]["regime"] = "sampled"
    with pytest.raises(ConfigError, match="sampled") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "rounds/r3/regime")


def test_bundle_of_an_unknown_round_names_the_key(cfg, repo_root):
    cfg["bundles"]["B3f"]["round"] = "r9"
    with pytest.raises(ConfigError, match="r9") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "bundles/B3f/round")


def test_bar_metric_outside_the_enum_names_the_key(cfg, repo_root):
    cfg["rounds"]["r3"]["bar"][1]["metric"] = "wins"
    with pytest.raises(ConfigError) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "rounds/r3/bar/1/metric")


# --- readout regimes and round bars -------------------------------------------------------


def test_as_served_regime_takes_the_bundles_decoding(resolved):
    served = resolved["evals"]["math"]["regimes"]["served"]
    s = resolved["bundles"]["B3f"]["serving"]
    assert (
        served["temperature"],
        served["top_p"],
        served["max_new_tokens"],
        served["repetition_penalty"],
    ) == (s["temperature"], s["top_p"], s["max_new_tokens"], s["repetition_penalty"])
    assert served["replicates"] == 3
    assert resolved["evals"]["math"]["regimes"]["greedy"]["replicates"] == 1  # the suite's default


def test_as_served_with_its_own_decoding_or_an_unknown_bundle_names_the_key(cfg, repo_root):
    cfg["evals"]["math"]["regimes"]["served"]["temperature"] = 0.2
    with pytest.raises(ConfigError, match="remove") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "evals/math/regimes/served/as_served")
    del cfg["evals"]["math"]["regimes"]["served"]["temperature"]
    cfg["evals"]["math"]["regimes"]["served"]["as_served"] = "B9"
    with pytest.raises(ConfigError, match="B9") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "evals/math/regimes/served/as_served")


@pytest.mark.parametrize(
    "clause, key, message",
    [
        ({"metric": "t", "op": ">", "value": 1.9}, "bar/2/metric", "replicates >= 2"),
        (
            {"metric": "delta", "op": ">=", "noise": {"stat": "mean_abs_delta", "times": -1}},
            "bar/2/noise",
            "needs >= 2 replicates",
        ),
        (
            {"metric": "loop_rate", "vs": "control", "op": "<=", "value": 2},
            "bar/2/vs",
            "no control",
        ),
        ({"metric": "delta", "vs": "none", "op": ">", "value": 0}, "bar/2/vs", "paired metric"),
        (
            {"metric": "delta", "regime": "sampled", "op": ">", "value": 0},
            "bar/2/regime",
            "math/sampled",
        ),
        (
            {
                "metric": "delta",
                "regime": "served",
                "op": ">=",
                "noise": {"stat": "spread", "arm": "Z9"},
            },
            "bar/2/noise/arm",
            "Z9",
        ),
    ],
    ids=[
        "t-needs-K2",
        "noise-needs-K2",
        "control-missing",
        "paired-vs-none",
        "unknown-regime",
        "noise-arm",
    ],
)
def test_a_clause_the_readouts_cannot_answer_names_its_key(cfg, repo_root, clause, key, message):
    cfg["rounds"]["r3"]["bar"].append(clause)
    with pytest.raises(ConfigError, match=message) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, f"rounds/r3/{key}")


def test_clause_with_both_value_and_noise_is_refused_by_the_schema(cfg, repo_root):
    cfg["rounds"]["r3"]["bar"][0]["noise"] = {"stat": "mean_abs_delta"}
    with pytest.raises(ConfigError) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "rounds/r3/bar/0")


def test_served_clauses_with_K3_and_a_control_resolve(cfg, repo_root):
    cfg["rounds"]["r3"]["control"] = "R220"
    cfg["rounds"]["r3"]["bar"] += [
        {"metric": "t", "regime": "served", "op": ">", "value": 1.9},
        {
            "metric": "delta",
            "regime": "served",
            "op": ">=",
            "noise": {"stat": "mean_abs_delta", "times": -1},
        },
        {"metric": "loop_rate", "vs": "control", "op": "<=", "value": 2.0},
        {"metric": "truncation_rate", "op": "<", "value": 5.0},
    ]
    assert len(resolve(cfg, repo_root)["rounds"]["r3"]["bar"]) == 6


def test_unknown_control_or_incumbent_as_candidate_names_the_key(cfg, repo_root):
    cfg["rounds"]["r3"]["control"] = "Q1"
    with pytest.raises(ConfigError, match="Q1") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "rounds/r3/control")
    del cfg["rounds"]["r3"]["control"]
    cfg["rounds"]["r3"]["candidates"].append("R2d")
    with pytest.raises(ConfigError, match="incumbent") as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, "rounds/r3/candidates")


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"a": "B7"}, "judged/B3_vs_R2d/a", "unknown arm 'B7'"),
        ({"b": "B3"}, "judged/B3_vs_R2d/b", "compares two arms"),
        ({"suite": "chat"}, "judged/B3_vs_R2d/suite", "unknown suite 'chat'"),
        ({"regime": "sampled"}, "judged/B3_vs_R2d/regime", "no regime 'sampled'"),
        ({"replicate": 3}, "judged/B3_vs_R2d/replicate", "has 3 replicate"),
        ({"n": 0}, "judged/B3_vs_R2d/n", "minimum"),
    ],
)
def test_a_bad_judged_read_names_the_key(cfg, repo_root, change, key, message):
    cfg["judged"]["B3_vs_R2d"].update(change)
    with pytest.raises(ConfigError, match=message) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, key)


def test_a_judged_read_resolves_its_replicate_and_scores_path(cfg, repo_root):
    cfg["judged"]["B3_vs_R2d"]["scores"] = "config/judged/B3_vs_R2d.csv"
    j = resolve(cfg, repo_root)["judged"]["B3_vs_R2d"]
    assert j["replicate"] == 0 and j["scores"] == str(repo_root / "config/judged/B3_vs_R2d.csv")


# --- YAML and path errors name the file and the line ------------------------------------


def test_a_yaml_syntax_error_in_an_arm_file_names_file_line_and_column(cfg, arms_copy, repo_root):
    (arms_copy / "B3.yaml").write_text("init: R2d\ncorpus: rft_r3\nhyper: lr: 1.0e-3\n")
    with pytest.raises(
        ConfigError,
        match=rf"^{re.escape(str(arms_copy / 'B3.yaml'))}:3:10: YAML syntax error: "
        "mapping values are not allowed here",
    ):
        resolve(cfg, repo_root)


def test_invalid_utf8_in_an_arm_file_names_the_line(cfg, arms_copy, repo_root):
    (arms_copy / "B3.yaml").write_bytes(b"init: R2d\ncorpus: rft_r3\ndescription: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"B3\.yaml:3:17: not valid UTF-8 \(byte 0xe9\)"):
        resolve(cfg, repo_root)


def test_a_yaml_syntax_error_in_config_yaml_names_the_line(tmp_path, repo_root, capsys):
    text = (
        (repo_root / CONFIG_FILE)
        .read_text()
        .replace("results_dir: results", "results_dir: [results", 1)
    )
    bad = tmp_path / "config.yaml"
    bad.write_text(text)
    line = (
        text.splitlines().index(next(x for x in text.splitlines() if x.startswith("results_dir")))
        + 1
    )
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(bad))}:{line + 1}:\d+: YAML syntax error"
    ):
        schema.load_yaml(bad)
    with pytest.raises(
        SystemExit, match=rf"arenaflow config error: {re.escape(str(bad))}:{line + 1}:"
    ):
        config_cli.main([str(bad)])


def test_a_missing_base_model_names_the_file_line_and_key(cfg, repo_root, tmp_path):
    over = tmp_path / "over.yaml"
    over.write_text("# an override\nbase:\n  name: x\n  path: models/no-such-model\n")
    cfg["base"]["path"] = "models/no-such-model"
    with pytest.raises(
        ConfigError,
        match=rf"^{re.escape(str(over))}:4: key 'base/path': no model directory "
        rf"{re.escape(str(repo_root / 'models/no-such-model'))} \(a relative path "
        r"is relative to the workflow's root",
    ):
        config.resolve(
            cfg,
            repo_root=repo_root,
            config_file=CONFIG_FILE,
            sources=[repo_root / CONFIG_FILE, over],
        )
    with pytest.raises(
        ConfigError, match=rf"^{CONFIG_FILE}: key 'base/path'"
    ):  # no sources: no line
        resolve(cfg, repo_root)


def test_a_peft_adapter_as_the_base_is_refused_at_config_time_naming_its_base(
    cfg, repo_root, tmp_path
):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/b"}))
    cfg["base"]["path"] = str(adapter)
    with pytest.raises(
        ConfigError,
        match=rf"^{CONFIG_FILE}: key 'base/path': {re.escape(str(adapter))} is a PEFT adapter "
        r"\(adapter_config.json\) on base 'org/b', not a model; set the base to",
    ):
        resolve(cfg, repo_root)


def test_a_base_without_a_chat_template_is_refused_under_own_naming_its_directory(
    cfg, repo_root, tmp_path
):
    base = tmp_path / "plain-base"
    base.mkdir()
    (base / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    cfg["base"]["path"] = str(base)
    with pytest.raises(
        ConfigError,
        match=rf"^{CONFIG_FILE}: key 'base/chat_template': base {re.escape(str(base))} has no "
        r"chat template of its own .*set base.chat_template to 'chatml' or to a .jinja file",
    ):
        resolve(cfg, repo_root)
    cfg["base"]["chat_template"] = "chatml"
    assert resolve(cfg, repo_root)["base"]["chat_template"] == "chatml"
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    cfg["base"]["chat_template"] = str(tmp_path / "t.jinja")
    assert resolve(cfg, repo_root)["base"]["chat_template"] == str(tmp_path / "t.jinja")
    cfg["base"]["chat_template"] = "no/such.jinja"
    with pytest.raises(ConfigError, match=r"key 'base/chat_template': no chat template file"):
        resolve(cfg, repo_root)


@pytest.mark.parametrize("family", ["gemma", "mistral"])
def test_a_system_prompt_under_a_template_that_refuses_one_is_refused(
    family, cfg, repo_root, tmp_path
):
    """Gemma and Mistral v0.1 raise_exception on a system turn: as the base's own template and
    as a .jinja file, refused naming the base, the template and the two ways out."""
    template = (repo_root / f"tests/data/chat_templates/{family}.jinja").read_text()
    base = tmp_path / "base"
    base.mkdir()
    (base / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (tmp_path / "t.jinja").write_text(template)
    cfg["base"]["path"] = str(base)
    for spec in ("own", str(tmp_path / "t.jinja")):
        cfg["base"]["chat_template"] = spec
        with pytest.raises(
            ConfigError,
            match=rf"^{CONFIG_FILE}: key 'system_prompt': base {re.escape(str(base))} with chat "
            rf"template {re.escape(repr(spec))} refuses a system turn \('.+'\), .*"
            r'set system_prompt: "" .*or another base.chat_template',
        ):
            resolve(cfg, repo_root)
    cfg["system_prompt"] = ""
    assert resolve(cfg, repo_root)["system_prompt"] == ""
    cfg["system_prompt"], cfg["base"]["chat_template"] = "Be brief.", "chatml"
    assert resolve(cfg, repo_root)["base"]["chat_template"] == "chatml"


@pytest.mark.parametrize("family", ["chatml", "llama3", "phi3"])
def test_a_template_that_takes_a_system_turn_passes_with_a_system_prompt(family, repo_root):
    template = (repo_root / f"tests/data/chat_templates/{family}.jinja").read_text()
    assert chatformat.system_turn_refusal(template) is None
    gemma = (repo_root / "tests/data/chat_templates/gemma.jinja").read_text()
    assert chatformat.system_turn_refusal(gemma) == "System role not supported"


def test_a_relative_pool_file_is_relative_to_the_workflows_root(cfg, tmp_path):
    root = tmp_path / "workflow"
    (root / "data").mkdir(parents=True)
    (root / "models").symlink_to(Path(schema.REPO_ROOT) / "models")
    (root / "data/x.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    cfg["arms_dir"] = str(Path(schema.REPO_ROOT) / "config/arms")
    cfg["continual"]["arms_dir"] = str(Path(schema.REPO_ROOT) / "config/continual")
    cfg["pools"]["gsm"] = {"file": "data/x.jsonl"}
    pool = config.resolve(cfg, repo_root=root)["pools"]["gsm"]
    assert pool == {"file": "data/x.jsonl", "root": str(root)}
    from arenaflow.pools import build as pools

    assert pools.build("gsm", pool)[0]["source"] == "data/x.jsonl:1"  # not the install's root
    cfg["pools"]["gsm"] = {"file": "data/y.jsonl"}
    with pytest.raises(
        ConfigError, match=r"key 'pools/gsm/file': no such file .*/workflow/data/y\.jsonl"
    ):
        config.resolve(cfg, repo_root=root)


# --- arm_overrides: one config's changes to arm files another lineage shares -------------


def test_an_override_merges_over_the_arm_file_and_train_defaults(cfg, repo_root, raw_cfg):
    cfg["arm_overrides"] = {
        "S1": {"hyper": {"lr": 3.0e-4, "lora": {"r": 4}}},
        "B2": {"description": "at another model's scale"},
    }
    arms = resolve(cfg, repo_root)["arms"]
    s1 = arms["S1"]["hyper"]
    assert (s1["lr"], s1["epochs"]) == (3.0e-4, 2)  # the file's epochs stay
    assert s1["lora"] == {**raw_cfg["train_defaults"]["lora"], "r": 4}  # merged, not replaced
    assert arms["B2"]["description"] == "at another model's scale"
    assert arms["B2"]["hyper"]["lr"] == 2.5e-4  # a description alone leaves the hyper be
    assert arms["S1"]["description"].startswith("Stage 1")


@pytest.mark.parametrize(
    "overrides, key, message",
    [
        ({"B9": {"hyper": {"lr": 1e-4}}}, "arm_overrides/B9", "no arm 'B9'"),
        ({"soup": {"hyper": {"lr": 1e-4}}}, "arm_overrides/soup/hyper", "a merge arm"),
        ({"B1": {"hyper": {"lr": -1e-4}}}, "arm_overrides/B1/hyper/lr", "minimum"),
        ({"B1": {"hyper": {"rate": 1e-4}}}, "arm_overrides/B1/hyper", "rate"),
        ({"B1": {}}, "arm_overrides/B1", "non-empty"),
    ],
)
def test_a_bad_override_names_its_key(cfg, repo_root, overrides, key, message):
    cfg["arm_overrides"] = overrides
    with pytest.raises(ConfigError, match=message) as e:
        resolve(cfg, repo_root)
    assert_names(e.value, CONFIG_FILE, key)


def test_the_smollm2_gpu_sweep_keeps_the_seeds_lr_ratios_around_r2ds_own(repo_root):
    """config/smollm2-gpu.yaml moves the B arms to SmolLM2's scale: the seed's sweep (B2 5e-6,
    B1 1e-5, B3 2e-5, B4 5e-5, docs/lineages.md) scaled so that B1 trains at R2d's LR."""
    merged, files = config.load_configs([repo_root / "config/smollm2-gpu.yaml"])
    merged["base"]["path"] = "models/tiny-arith"  # the SmolLM2 import is not in a checkout
    arms = config.resolve(merged, repo_root=repo_root, config_file="smollm2-gpu")["arms"]
    seed = {"B2": 5e-6, "B1": 1e-5, "B3": 2e-5, "B4": 5e-5}
    r2d = arms["R2d"]["hyper"]["lr"]
    for arm, lr in seed.items():
        assert arms[arm]["hyper"]["lr"] == pytest.approx(r2d * lr / seed["B1"], rel=1e-12), arm
        assert f"lr {arms[arm]['hyper']['lr']:.0e}".replace("e-0", "e-") in arms[arm]["description"]
