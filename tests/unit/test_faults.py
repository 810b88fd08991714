"""Fault injection: every consumer verifies what it reads, and every writer leaves a whole
output or none (chain of custody).

Each probe injects one fault and checks one of two outcomes:
- refused: the step fails naming the changed file, and writes nothing downstream;
- recovered: after the fault (kill -9, a concurrent writer, a read-only or full disk) the
  previous outputs are intact and a rerun or resume gives the complete output.

PROBES lists them, and ELSEWHERE those whose tests live beside their own setup (the ones
through Snakemake in tests/e2e/test_dag_small.py, the bar registration's); README.md's
"Reliability" section gives their count, which test_readme_states_the_probe_counts keeps in
step with these tables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from hypers import TINY_ARM
from safetensors.torch import load_file
from test_nominate import write_readout  # the same readout rows the nomination tests judge

from arenaflow import candidates, io, manifest, models
from arenaflow.bases import tinymodel
from arenaflow.bundles import build as bundles
from arenaflow.corpora import build as corpora
from arenaflow.evals import compare as comparisons
from arenaflow.evals import readout, readout_file
from arenaflow.pools import math as mathpool
from arenaflow.rounds import nominate
from arenaflow.train import argv as train_argv
from arenaflow.train import data

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "models/tiny-arith"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# test function -> (the fault injected, the outcome checked)
PROBES = {
    "test_adapter_bit_flip_before_a_readout": ("a flipped bit in an arm's adapter", "refused"),
    "test_adapter_bit_flip_before_sampling": ("a flipped bit in the policy's adapter", "refused"),
    "test_init_adapter_bit_flip_before_child_training": (
        "a flipped bit in the init arm's adapter",
        "refused",
    ),
    "test_tampered_corpus_before_training": ("a flipped bit in a corpus's sft.npz", "refused"),
    "test_readout_bit_flip_before_compare": ("a flipped bit in a readout's data page", "refused"),
    "test_readout_rewritten_before_nomination": (
        "a readout rewritten after it was compared",
        "refused",
    ),
    "test_compare_edited_before_nomination[edited]": ("a compare file edited by hand", "refused"),
    "test_compare_edited_before_nomination[unsealed]": (
        "a compare file without its seal",
        "refused",
    ),
    "test_ancestor_adapter_bit_flip_before_a_bundle": (
        "a flipped bit in an ancestor arm's adapter",
        "refused",
    ),
    "test_run_directories_swapped_before_a_readout": (
        "two arms' run directories swapped",
        "refused",
    ),
    "test_corpora_swapped_before_training": ("a corpus under another corpus's name", "refused"),
    "test_served_readout_copied_over_the_greedy_one_before_compare": (
        "the served readout copied over the greedy one",
        "refused",
    ),
    "test_replicate_copied_over_another_before_compare": (
        "one replicate's readout copied over another's",
        "refused",
    ),
    "test_run_retrained_after_its_readouts_before_the_bundle": (
        "the served run replaced after the readouts the nomination judged",
        "refused",
    ),
    "test_pool_row_deleted_before_a_readout": ("a row deleted from a built pool", "refused"),
    "test_sample_duplicated_before_verification": (
        "a sample duplicated in a samples file",
        "refused",
    ),
    "test_verdict_flipped_to_correct_before_the_corpus_build": (
        "a wrong sample's verdict flipped to correct",
        "refused",
    ),
    "test_eval_prompt_disguised_in_a_training_pool_before_a_corpus": (
        "an eval prompt in a training pool behind a 'Question:' label, case, spacing, a word",
        "refused",
    ),
    "test_kill_9_while_a_corpus_is_written": ("kill -9 of a corpus build mid-write", "recovered"),
    "test_kill_9_during_training_resumes_to_the_same_weights": (
        "kill -9 of a training run",
        "recovered",
    ),
    "test_concurrent_writers_leave_one_whole_output": (
        "three concurrent builds of one corpus",
        "recovered",
    ),
    "test_read_only_disk": ("a read-only results file system", "recovered"),
    "test_full_disk": ("a full results file system", "recovered"),
}
# Probes whose tests live beside their own setup: file -> {test: (fault, outcome)}.
ELSEWHERE = {
    "tests/e2e/test_dag_small.py": {
        "test_a_flipped_adapter_bit_fails_its_readout_and_changes_nothing_downstream": (
            "a flipped bit in runs/B3/final before its readout, through Snakemake",
            "refused",
        ),
        "test_a_failed_bundle_rebuild_keeps_the_good_bundle": (
            "a bundle rebuild that fails (its served run refused), through Snakemake",
            "recovered",
        ),
    },
    "tests/unit/test_validation.py": {
        "test_an_empty_eval_pool_stops_the_corpus_build_and_writes_nothing": (
            "an eval pool emptied after its build",
            "refused",
        ),
        "test_a_readout_of_an_empty_pool_is_refused_and_writes_nothing": (
            "an eval pool emptied before its readout",
            "refused",
        ),
        "test_snakemake_refuses_an_empty_pool_before_planning_any_job": (
            "a built pool emptied in place, through Snakemake",
            "refused",
        ),
        "test_the_pool_command_refuses_an_oversized_prompt_and_writes_no_pool": (
            "a 200 KB prompt in an imported pool's file",
            "refused",
        ),
        "test_the_corpus_command_names_the_verdicts_file_it_read": (
            "a verdict row deleted before the corpus build",
            "refused",
        ),
    },
    "tests/unit/test_resume.py": {
        "test_a_killed_sampling_job_resumes_to_the_uninterrupted_samples": (
            "a sampling job killed after 2 of its 3 batches",
            "recovered",
        ),
        "test_parts_of_another_job_or_failing_their_hash_are_decoded_again": (
            "a sampling job's finished batches left by another seed, one flipped, one truncated",
            "recovered",
        ),
        "test_a_killed_readout_resumes_to_the_same_rows_past_other_and_bad_parts": (
            "a readout killed after 2 of its 3 batches, past another temperature's and a bad one",
            "recovered",
        ),
    },
    "tests/unit/test_checkpoint_manifest.py": {
        "test_a_bit_flipped_optimizer_shard_is_refused_naming_it": (
            "a flipped bit in a training checkpoint's optimizer shard before its resume",
            "refused",
        ),
        "test_a_stale_optimizer_shard_from_another_step_is_refused_naming_it": (
            "a checkpoint's optimizer shard replaced by another step's before its resume",
            "refused",
        ),
    },
    "tests/unit/test_bar_registration.py": {
        "test_a_deleted_registration_is_refused_naming_the_journal": (
            "a round's registry and .bar.json deleted and a different bar registered",
            "refused",
        ),
        "test_a_registry_written_over_the_deleted_one_is_refused_by_judge": (
            "a round's registry replaced by one for a different bar, the readouts made again",
            "refused",
        ),
    },
}


def flip_bit(path: Path, offset: int = -1) -> int:
    """Flip the lowest bit of one byte in place; return the byte's offset (flip again to undo)."""
    raw = bytearray(path.read_bytes())
    offset %= len(raw)
    raw[offset] ^= 1
    path.write_bytes(bytes(raw))
    return offset


def leftovers(d: Path) -> list[str]:
    """In-flight temporaries (arenaflow.io) anywhere under d: a whole output leaves none."""
    return sorted(p.name for p in d.rglob(".*.tmp"))


@pytest.fixture(scope="module")
def arm(tmp_path_factory) -> Path:
    """An arm's run directory as training leaves it: a PEFT adapter, its evidence, a manifest."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    run = tmp_path_factory.mktemp("arm") / "runs/A/final"
    get_peft_model(models.load_base(BASE), cfg).save_pretrained(str(run))
    io.write_json(
        run / "training_evidence.json",
        {
            "arm": "A",
            "corpus": "c",
            "base_model": "tiny-arith",
            "base_revision": "r",
            "init": "base",
        },
    )
    manifest.write(run)
    return run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus") / "corpora/c"
    rows = mathpool.generate(24, 7, "train", {"add": 1, "mul": 1}, "f")
    corpora.build(out, rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {})
    return out


@pytest.fixture
def pool(tmp_path) -> Path:
    path = tmp_path / "pool.jsonl"
    io.write_jsonl(path, mathpool.generate(4, 11, "eval", {"add": 1}, "e"))
    return path


def copy_arm(arm: Path, root: Path, name: str = "A") -> Path:
    run = root / "runs" / name / "final"
    shutil.copytree(arm, run)
    return run


# --- refused: a consumer never reads what does not verify ---------------------------------


def readout_args(pool: Path, adapter: Path, out: Path) -> list[str]:
    return [
        "readout",
        "--suite",
        "math",
        "--arm",
        "A",
        "--pool",
        str(pool),
        "--base-model",
        str(BASE),
        "--adapter",
        str(adapter),
        "--regime",
        "greedy",
        "--batch-size",
        "4",
        "--regime-json",
        json.dumps({"temperature": 0.0, "max_new_tokens": 12}),
        "--out",
        str(out),
    ]


def test_adapter_bit_flip_before_a_readout(arm, pool, tmp_path):
    run = copy_arm(arm, tmp_path)
    offset = flip_bit(run / "adapter_model.safetensors")
    load_file(
        run / "adapter_model.safetensors"
    )  # the flip is silent to the loader: only the hash sees it
    out = tmp_path / "readouts/math/A/greedy.r0.parquet"
    with pytest.raises(
        manifest.ManifestError, match=r"readout refused .*adapter_model\.safetensors: sha256"
    ):
        readout.main(readout_args(pool, run, out))
    assert not out.parent.exists() or not any(out.parent.iterdir())
    flip_bit(run / "adapter_model.safetensors", offset)  # restored: the same job now runs
    readout.main(readout_args(pool, run, out))
    assert len(readout_file.read_readout(out)) == 4


def test_adapter_bit_flip_before_sampling(arm, pool, tmp_path):
    run = copy_arm(arm, tmp_path)
    flip_bit(run / "adapter_model.safetensors")
    out = tmp_path / "candidates/c/samples.jsonl"
    params = {
        "k": 2,
        "temperature": 0.8,
        "top_p": 1.0,
        "max_new_tokens": 12,
        "seed": 0,
        "batch_size": 8,
    }
    with pytest.raises(
        manifest.ManifestError, match=r"sampling refused .*adapter_model\.safetensors"
    ):
        candidates.main(
            [
                "sample",
                "--pool",
                str(pool),
                "--base-model",
                str(BASE),
                "--adapter",
                str(run),
                "--params-json",
                json.dumps(params),
                "--out",
                str(out),
            ]
        )
    assert not out.parent.exists()


HYPER = TINY_ARM


def train_cmd(out: Path, corpus: Path, init: str, hyper: dict) -> list[str]:
    return train_argv(out.parent.name, hyper, corpus, BASE, out, init)


def test_init_adapter_bit_flip_before_child_training(arm, corpus, tmp_path):
    init = copy_arm(arm, tmp_path)
    flip_bit(init / "adapter_model.safetensors")
    out = tmp_path / "runs/B/final"
    proc = subprocess.run(
        train_cmd(out, corpus, str(init), HYPER),
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert proc.returncode != 0
    assert re.search(
        r"training \(init arm\) refused .*A/final/adapter_model\.safetensors: sha256", proc.stderr
    )
    assert not out.parent.exists()  # not even the checkpoints or the live metrics


def test_tampered_corpus_before_training(corpus, tmp_path):
    bad = tmp_path / "corpora/c"
    shutil.copytree(corpus, bad)
    flip_bit(bad / "sft.npz", os.path.getsize(bad / "sft.npz") // 2)  # inside the token ids
    with pytest.raises(
        manifest.ManifestError, match=r"training \(corpus\) refused .*sft\.npz: sha256"
    ):
        data.load_corpus(bad)  # what train.loop.run calls first (tests/unit/test_train.py: the CLI)


# --- refused: an artifact under another's name ---------------------------------------------


def named_arm(arm: Path, root: Path, name: str) -> Path:
    """A copy of `arm` as training leaves runs/{name}/final: its evidence and manifest name it."""
    run = copy_arm(arm, root, name)
    io.write_json(run / "training_evidence.json", {"arm": name, "init": "base"})
    manifest.write(run, written_as=run)
    return run


def test_run_directories_swapped_before_a_readout(arm, pool, tmp_path):
    a, b = named_arm(arm, tmp_path, "A"), named_arm(arm, tmp_path, "B")
    a.rename(tmp_path / "swap")
    b.rename(a)
    (tmp_path / "swap").rename(b)
    out = tmp_path / "readouts/math/A/greedy.r0.parquet"
    with pytest.raises(manifest.ManifestError, match=r"readout refused .*written as B/final"):
        readout.main(readout_args(pool, a, out))
    assert not out.exists()


def test_corpora_swapped_before_training(corpus, tmp_path):
    (tmp_path / "corpora").mkdir()
    shutil.copytree(corpus, tmp_path / "corpora/d")  # corpus c's directory, under d's name
    with pytest.raises(
        manifest.ManifestError, match=r"training \(corpus\) refused .*written as corpora/c"
    ):
        data.load_corpus(tmp_path / "corpora/d")


def two_readouts(arm, pool, tmp_path, names: list[tuple[str, dict]]) -> list[Path]:
    """Readouts of arm A (adapter `arm`) under readouts/math/A/, one per (name, decoding)."""
    run = named_arm(arm, tmp_path, "A")
    outs = []
    for name, decoding in names:
        out = tmp_path / f"readouts/math/A/{name}.parquet"
        regime, rep = name.split(".r")
        args = readout_args(pool, run, out)
        args[args.index("--regime") + 1] = regime
        args[args.index("--regime-json") + 1] = json.dumps(decoding)
        readout.main([*args, "--replicate", rep])
        outs.append(out)
    return outs


GREEDY = {"temperature": 0.0, "max_new_tokens": 12}


def test_served_readout_copied_over_the_greedy_one_before_compare(arm, pool, tmp_path):
    served = {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 12}
    greedy, sampled = two_readouts(
        arm, pool, tmp_path, [("greedy.r0", GREEDY), ("served.r0", served)]
    )
    shutil.copy2(sampled, greedy)
    out = tmp_path / "compare/math/greedy/A__A.json"
    with pytest.raises(
        manifest.ManifestError,
        match=r"greedy\.r0\.parquet: records regime 'served', its path says 'greedy'",
    ):
        comparisons.main(
            ["compare", "--suite", "math", "--regime", "greedy", "--cand", str(greedy),
             "--ref", str(greedy), "--out", str(out)]
        )  # fmt: skip
    assert not out.exists()


def test_replicate_copied_over_another_before_compare(arm, pool, tmp_path):
    r0, r1 = two_readouts(arm, pool, tmp_path, [("greedy.r0", GREEDY), ("greedy.r1", GREEDY)])
    shutil.copy2(r0, r1)
    out = tmp_path / "noise/math/greedy/A.json"
    with pytest.raises(manifest.ManifestError, match=r"greedy\.r1\.parquet: records replicate"):
        comparisons.main(
            ["noise", "--suite", "math", "--regime", "greedy", "--readouts", str(r0), str(r1),
             "--out", str(out)]
        )  # fmt: skip
    assert not out.exists()


def test_run_retrained_after_its_readouts_before_the_bundle(arm, pool, tmp_path, monkeypatch):
    """The nomination judged readouts of A's weights; A's run is then replaced by another whose
    own manifest verifies (retrained, or restored from elsewhere): the bundle refuses it."""
    from arenaflow.bundles import sources

    (readout,) = two_readouts(arm, pool, tmp_path, [("greedy.r0", GREEDY)])
    run = tmp_path / "runs/A/final"
    weights = load_file(run / "adapter_model.safetensors")
    from safetensors.torch import save_file

    save_file({k: v + 1 for k, v in weights.items()}, run / "adapter_model.safetensors")
    manifest.write(run, written_as=run)
    manifest.verify(run)  # the run itself is whole: only the readouts' record tells
    monkeypatch.chdir(tmp_path)  # a nomination's paths are relative to the results directory
    nomination = {"inputs": {str(readout.relative_to(tmp_path)): "sha"}}
    with pytest.raises(
        manifest.ManifestError,
        match=r"bundle B refused .*runs/A/final: its manifest digest \w+ is not",
    ):
        sources.check_judged_weights(nomination, "A", Path("runs"), "bundle B")


# --- refused: upstream files changed after they were written ---------------------------------


def built_pool(tmp_path: Path) -> Path:
    """pools/math_eval.jsonl as the pool rule leaves it: the rows and their sidecar manifest."""
    from arenaflow.pools import build as pools

    out = tmp_path / "pools/math_eval.jsonl"
    params = {"n": 4, "seed": 11, "split": "eval", "categories": {"add": 1}}
    pools.main(["--pool", "math_eval", "--params-json", json.dumps(params), "--out", str(out)])
    return out


def test_pool_row_deleted_before_a_readout(arm, tmp_path):
    pool = built_pool(tmp_path)
    pool.write_text("".join(pool.read_text().splitlines(keepends=True)[1:]))
    out = tmp_path / "readouts/math/A/greedy.r0.parquet"
    with pytest.raises(
        manifest.ManifestError, match=r"refused .*pools/math_eval\.jsonl: sha256 \w+ does not match"
    ):
        readout.main(readout_args(pool, named_arm(arm, tmp_path, "A"), out))
    assert not out.exists()


def test_sample_duplicated_before_verification(tmp_path):
    pool = built_pool(tmp_path)
    samples = tmp_path / "candidates/c/samples.jsonl"
    rows = [
        {"id": f"{r['id']}#0", "prompt_id": r["id"], "sample": 0, "text": "The answer is 3.",
         "n_tokens": 5, "stopped": True}
        for r in io.read_jsonl(pool)
    ]  # fmt: skip
    io.write_jsonl(samples, rows)
    manifest.write_file(samples, rows=len(rows))
    io.write_jsonl(samples, [*rows, rows[0]])
    out = tmp_path / "candidates/c/verdicts.jsonl"
    with pytest.raises(
        manifest.ManifestError, match=r"verifying refused .*candidates/c/samples\.jsonl: sha256"
    ):
        candidates.main(
            ["verify", "--pool", str(pool), "--samples", str(samples), "--out", str(out)]
        )
    assert not out.exists()


def test_verdict_flipped_to_correct_before_the_corpus_build(tmp_path):
    """A wrong sample's verdict edited to correct: the corpus builder verifies each sample it
    keeps again against the gold, refuses naming the verdicts file and the verdict, and writes
    no corpus."""
    pool = mathpool.generate(1, 3, "train", {"add": 1}, "p")
    wrong = f"The answer is {int(pool[0]['gold']) + 1}."
    samples = [
        {"id": f"p0#{j}", "prompt_id": pool[0]["id"], "sample": j, "text": wrong,
         "n_tokens": 6, "stopped": True}
        for j in range(2)
    ]  # fmt: skip
    verdicts = [candidates.verdict(s, pool[0]) for s in samples]
    assert not any(v["correct"] for v in verdicts)
    verdicts[1]["correct"] = True
    out = tmp_path / "corpora/c"
    with pytest.raises(
        ValueError, match=r"verdicts\.jsonl: verdict 'p0#1' says correct=True, but its sample"
    ):
        corpora.build(
            out, pool, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT,
            {"k": 2, "seed": 0, "select": "median", "min_chars": 0}, samples, verdicts,
            verdicts_file="candidates/c/verdicts.jsonl",
        )  # fmt: skip
    assert not out.exists()


def test_eval_prompt_disguised_in_a_training_pool_before_a_corpus(pool, tmp_path):
    evals = io.read_jsonl(pool)
    rows = mathpool.generate(12, 7, "train", {"add": 1}, "f")
    disguised = f"Question: {evals[2]['prompt'].upper().replace('?', ' ?')}  Thanks."
    rows[5] = {**rows[5], "prompt": disguised}  # a prefix, case, spacing and a word added
    out = tmp_path / "corpora/c"
    tok = tinymodel.build_tokenizer()
    corpora.build(out, rows, tok, tinymodel.SYSTEM_PROMPT, {}, eval_items=evals)
    kept = [r["id"] for r in io.read_jsonl(out / "rows.jsonl")]
    assert kept == [r["id"] for i, r in enumerate(rows) if i != 5]
    record = json.loads((out / "stats.json").read_text())["decontamination"]
    assert record["dropped_ids"] == [
        {"id": rows[5]["id"], "eval_id": evals[2]["id"], "rule": "subsequence"}
    ]
    manifest.verify(out)


ROUND = {
    "suite": "math",
    "regime": "greedy",
    "incumbent": "R2d",
    "candidates": ["B3"],
    "bar": [{"metric": "delta", "op": ">", "value": 0.0}],
}


@pytest.fixture
def compared(tmp_path) -> dict:
    """A round's bar registered, then two readouts and their compare JSON, as the rules leave
    them."""
    reg = tmp_path / "nominations/r3.bar.json"
    nominate.main(
        ["register", "--round", "r3", "--round-json", json.dumps(ROUND), "--out", str(reg)]
    )
    cand = write_readout(tmp_path / "B3.r0.parquet", "B3", [True, True, True, False] * 6)
    ref = write_readout(tmp_path / "R2d.r0.parquet", "R2d", [True, False, False, False] * 6)
    out = tmp_path / "compare/math/greedy/B3__R2d.json"
    comparisons.main(
        [
            "compare",
            "--suite",
            "math",
            "--regime",
            "greedy",
            "--cand",
            cand,
            "--ref",
            ref,
            "--out",
            str(out),
        ]
    )
    return {"cand": cand, "ref": ref, "compare": str(out), "reg": str(reg)}


def judge(c: dict) -> Path:
    out = Path(c["reg"]).parent / "r3.json"
    nominate.main(
        [
            "judge",
            "--round",
            "r3",
            "--round-json",
            json.dumps(ROUND),
            "--registration",
            c["reg"],
            "--compare",
            c["compare"],
            "--readouts",
            c["cand"],
            "--out",
            str(out),
        ]
    )
    return out


def last_byte_of_column(path: str, name: str) -> int:
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata.row_group(0)
    col = next(
        meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == name
    )
    start = col.dictionary_page_offset or col.data_page_offset
    return start + col.total_compressed_size - 1  # the last page's body, under its CRC


def test_readout_bit_flip_before_compare(compared, tmp_path):
    flip_bit(Path(compared["cand"]), last_byte_of_column(compared["cand"], "correct"))
    out = tmp_path / "compare/again.json"
    with pytest.raises(manifest.ManifestError, match=r"B3\.r0\.parquet: unreadable readout: .*CRC"):
        comparisons.main(
            ["compare", "--cand", compared["cand"], "--ref", compared["ref"], "--out", str(out)]
        )
    assert not out.exists()


def test_readout_rewritten_before_nomination(compared):
    nomination = judge(compared).read_bytes()  # as written: the round is judged
    # a whole, well-formed parquet with fresh checksums: only the sha256 the compare recorded
    # differs
    write_readout(Path(compared["cand"]), "B3", [True] * 24)
    with pytest.raises(
        manifest.ManifestError, match=r"B3\.r0\.parquet: sha256 .* recorded in .*B3__R2d\.json"
    ):
        judge(compared)
    assert (Path(compared["reg"]).parent / "r3.json").read_bytes() == nomination  # not rewritten


@pytest.mark.parametrize("how", ["edited", "unsealed"])
def test_compare_edited_before_nomination(compared, how):
    path = Path(compared["compare"])
    rec = io.read_json(path)
    nomination = judge(compared).read_bytes()  # as written: the round is judged
    if how == "edited":
        rec["delta"] += 10.0
    else:
        rec.pop(manifest.SEAL)
    io.write_json(path, rec)
    want = "does not match its sealed_sha256" if how == "edited" else "no sealed_sha256"
    with pytest.raises(manifest.ManifestError, match=rf"B3__R2d\.json: .*{want}"):
        judge(compared)
    assert (Path(compared["reg"]).parent / "r3.json").read_bytes() == nomination  # not rewritten


def test_ancestor_adapter_bit_flip_before_a_bundle(arm, corpus, tmp_path, capsys):
    copy_arm(arm, tmp_path, "A")
    parent = copy_arm(arm, tmp_path, "P")
    shutil.copytree(corpus, tmp_path / "corpora/c")
    flip_bit(parent / "adapter_model.safetensors")
    cfg = {
        "chat_template": "chatml",
        "system_prompt": "S",
        "reload_prompts": ["1+1?"],
        "serving": {
            "do_sample": False,
            "temperature": 0.0,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
            "max_new_tokens": 8,
        },
    }
    with pytest.raises(SystemExit) as e:
        bundles.main(
            [
                "build",
                "--bundle",
                "X",
                "--arm",
                "A",
                "--lineage-json",
                '{"A": ["P"]}',
                "--runs",
                str(tmp_path / "runs"),
                "--corpora",
                str(tmp_path / "corpora"),
                "--base-model",
                str(BASE),
                "--bundle-json",
                json.dumps(cfg),
                "--out",
                str(tmp_path / "bundles/X"),
            ]
        )
    assert e.value.code == 1
    assert re.search(
        r"no bundle written: bundle X refused .*P/final/adapter_model\.safetensors",
        capsys.readouterr().err,
    )
    assert not (tmp_path / "bundles").exists() or not any((tmp_path / "bundles").iterdir())


# --- recovered: whole outputs or none, and the rerun completes ----------------------------


def start(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,
        **kw,
    )


def test_kill_9_while_a_corpus_is_written(corpus, tmp_path):
    out = tmp_path / "corpora/c"
    shutil.copytree(corpus, out)  # the previous build, which a rebuild replaces
    before = manifest.verify(out)["digest"]
    # the rebuild stops where its files are written but not yet renamed into place
    proc = start(f"""
        import time
        from arenaflow import manifest
        from arenaflow.bases import tinymodel
        from arenaflow.corpora import build as corpora
        from arenaflow.pools import math as mathpool
        def stall(*a, **k):
            print("written", flush=True)
            time.sleep(600)
        manifest.write = stall
        rows = mathpool.generate(30, 8, "train", {{"sub": 1}}, "k")
        corpora.build(
            {str(out)!r}, rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {{}}
        )
    """)
    assert proc.stdout.readline().strip() == "written", proc.stderr.read()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert manifest.verify(out)["digest"] == before  # the old corpus, whole
    assert leftovers(out.parent)  # the killed build's temporary, never taken for the output
    rows = mathpool.generate(30, 8, "train", {"sub": 1}, "k")
    corpora.build(out, rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {})  # the rerun
    assert manifest.verify(out)["digest"] != before


def test_kill_9_during_training_resumes_to_the_same_weights(corpus, tmp_path):
    hyper = {**HYPER, "checkpoint_every": 1, "max_steps": 6}
    whole = tmp_path / "W/final"
    subprocess.run(
        train_cmd(whole, corpus, "base", hyper),
        check=True,
        capture_output=True,
        env=ENV,
        timeout=600,
    )
    cut = tmp_path / "K/final"
    proc = subprocess.Popen(
        train_cmd(cut, corpus, "base", hyper),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
        start_new_session=True,
    )
    meta = cut.parent / "checkpoints/fingerprint.json"
    while not meta.exists() and proc.poll() is None:  # kill -9 once a checkpoint is committed
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and not cut.exists()
    subprocess.run(
        train_cmd(cut, corpus, "base", hyper), check=True, capture_output=True, env=ENV, timeout=600
    )
    ev = io.read_json(cut / "training_evidence.json")
    assert ev["resumed_from_step"] >= 1 and ev["optimizer_steps"] == 6
    a, b = (
        load_file(whole / "adapter_model.safetensors"),
        load_file(cut / "adapter_model.safetensors"),
    )
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-6, rtol=1e-5)
    manifest.verify(cut)


def corpus_digest(root: Path, seed: int) -> str:
    rows = mathpool.generate(20, seed, "train", {"add": 1}, "w")
    return corpora.build(
        root / f"c{seed}", rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {}
    )["digest"]


def test_concurrent_writers_leave_one_whole_output(tmp_path):
    out = tmp_path / "corpora/c"
    whole = {
        corpus_digest(tmp_path / "alone", s) for s in (1, 2, 3)
    }  # what each writer alone writes
    writer = """
        import sys
        from arenaflow.bases import tinymodel
        from arenaflow.corpora import build as corpora
        from arenaflow.pools import math as mathpool
        rows = mathpool.generate(20, int(sys.argv[1]), "train", {"add": 1}, "w")
        for _ in range(4):
            try:
                corpora.build(
                    sys.argv[2], rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {}
                )
            except OSError as e:  # another writer's directory landed between ours and the path
                print("lost a race:", e, file=sys.stderr)
    """
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(writer), str(s), str(out)],
            env=ENV,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in (1, 2, 3)
    ]
    seen = set()
    while any(p.poll() is None for p in procs):  # a reader never sees a mixed directory
        try:
            seen.add(manifest.verify(out)["digest"])
        except (manifest.ManifestError, FileNotFoundError):
            pass  # refused, or caught in the rename's instant: never consumed
    assert all(p.returncode == 0 for p in procs), [p.stderr.read() for p in procs]
    assert seen and seen <= whole  # every directory a reader accepted was one writer's, whole
    assert manifest.verify(out)["digest"] in whole and not leftovers(out.parent)


# --- disks: a tmpfs in a user and mount namespace of its own (no privileges needed) --------


def in_namespace(disk: Path, *scripts: str) -> dict:
    """Run `scripts` (Python, one after the other) with D, a 4 MiB tmpfs mounted on `disk` for
    them alone (the mount ends with the process); the last stdout line is JSON. Skips where
    unprivileged user namespaces are off."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode:
        pytest.skip("no unprivileged user+mount namespaces here (unshare -rm)")
    disk.mkdir()
    code = "import json, os, pathlib, subprocess\nD = os.environ['D']\n" + "".join(
        map(textwrap.dedent, scripts)
    )
    shell = 'mount -t tmpfs -o size=4m tmpfs "$D" && exec "$0" -c "$1"'
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", shell, sys.executable, code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**ENV, "D": str(disk)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


WRITERS = """
    import pandas as pd
    from arenaflow import manifest
    from arenaflow.bases import tinymodel
    from arenaflow.corpora import build as corpora
    from arenaflow.evals import readout_file, readout_rows
    from arenaflow.evals import compare as comparisons
    from arenaflow.pools import math as mathpool
    def readout(path, n):
        df = pd.DataFrame({"arm": "A", "item_id": [f"i{j}" for j in range(n)], "category": "add",
                           "prompt_sha256": "p", "target_sha256": "t", "n_tokens": 9,
                           "stopped": True,
                           "completion": [f"{j} + {j} = {2 * j}. The answer is {2 * j}."
                                          for j in range(n)],
                           "pred": "x", "strict": True, "correct": True, "replicate": 0})
        readout_file.write_readout(readout_rows.structure(df), path, {"arm": "A"})
    def corpus(path, n):
        rows = mathpool.generate(n, n, "train", {"add": 1}, "d")
        corpora.build(path, rows, tinymodel.build_tokenizer(), tinymodel.SYSTEM_PROMPT, {})
    def attempt(fn, *a):
        try:
            fn(*a)
            return "ok"
        except OSError as e:
            return os.strerror(e.errno) if e.errno else str(e)
    def state():
        names = sorted(str(p.relative_to(D)) for p in pathlib.Path(D).rglob("*"))
        return {"tmp": [n for n in names if n.split("/")[-1].startswith(".")],
                "readout_rows": len(readout_file.read_readout(f"{D}/r.parquet")),
                "corpus_rows": len(open(f"{D}/c/rows.jsonl").readlines()),
                "corpus_ok": bool(manifest.verify(f"{D}/c"))}
    readout(f"{D}/r.parquet", 10)  # the outputs a previous run left
    corpus(f"{D}/c", 10)
"""


def test_read_only_disk(tmp_path):
    res = in_namespace(
        tmp_path / "disk",
        WRITERS,
        """
        subprocess.run(["mount", "-o", "remount,ro", D], check=True)
        failed = [attempt(readout, f"{D}/r.parquet", 20), attempt(corpus, f"{D}/c", 20)]
        during = state()
        subprocess.run(["mount", "-o", "remount,rw", D], check=True)
        rerun = [attempt(readout, f"{D}/r.parquet", 20), attempt(corpus, f"{D}/c", 20)]
        print(json.dumps({"failed": failed, "during": during, "rerun": rerun, "after": state()}))
    """,
    )
    assert res["failed"] == ["Read-only file system"] * 2
    assert res["during"] == {"tmp": [], "readout_rows": 10, "corpus_rows": 10, "corpus_ok": True}
    assert res["rerun"] == ["ok", "ok"]
    assert res["after"] == {"tmp": [], "readout_rows": 20, "corpus_rows": 20, "corpus_ok": True}


def test_full_disk(tmp_path):
    res = in_namespace(
        tmp_path / "disk",
        WRITERS,
        """
        # fill the disk, then free 16 KiB: the writes below fail midway
        with open(f"{D}/filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\\0" * 4096)
            except OSError:
                pass
        os.truncate(f"{D}/filler", os.path.getsize(f"{D}/filler") - 16384)
        failed = [attempt(readout, f"{D}/r.parquet", 4000), attempt(corpus, f"{D}/c", 400)]
        during = state()
        os.remove(f"{D}/filler")
        rerun = [attempt(readout, f"{D}/r.parquet", 4000), attempt(corpus, f"{D}/c", 400)]
        print(json.dumps({"failed": failed, "during": during, "rerun": rerun, "after": state()}))
    """,
    )
    assert all("No space left on device" in f for f in res["failed"]), res["failed"]
    assert res["during"] == {"tmp": [], "readout_rows": 10, "corpus_rows": 10, "corpus_ok": True}
    assert res["rerun"] == ["ok", "ok"]
    assert res["after"] == {"tmp": [], "readout_rows": 4000, "corpus_rows": 400, "corpus_ok": True}


# --- the count the README gives -------------------------------------------------------------


def test_readme_states_the_probe_counts():
    names = {n.split("[")[0] for n in PROBES}
    assert all(callable(globals().get(n)) for n in names), "a probe without its test"
    probes = dict(PROBES)
    for path, tests in ELSEWHERE.items():
        text = (REPO / path).read_text(encoding="utf-8")
        assert all(f"def {n}(" in text for n in tests), f"a probe without its test in {path}"
        probes.update(tests)
    refused = sum(o == "refused" for _, o in probes.values())
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())  # lines rewrapped
    want = (
        f"{len(probes)} faults injected: {refused} refused, naming the file, with nothing "
        f"downstream written; {len(probes) - refused} recovered"
    )
    assert want in readme, f"README's Reliability section should say: {want}"
