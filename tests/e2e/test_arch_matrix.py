"""The architecture matrix (scripts/arch_matrix.py): config/examples/own-model.yaml through
Snakemake on a tiny random model of each of ten architectures (Llama, Qwen2, Qwen3, Mistral,
Gemma 2, Gemma 3, Phi-3 and GPT-NeoX with partial rotary, Qwen3-MoE, the Falcon-H1 hybrid) with the
embedded default's ChatML tokenizer: each either builds its bundle, with candidates sampled from its
base and verified, both arms trained, every arm read out and the bundle reloaded as a server would,
or is refused before any job naming the architecture. Marked `archs` (CI runs it;
docs/operations.md gives its time)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest
from dagrun import REPO, serve_greedy

from arenaflow import io, manifest

pytestmark = pytest.mark.archs

sys.path.insert(0, str(REPO / "scripts"))
import arch_matrix  # noqa: E402


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    root = tmp_path_factory.mktemp("arch_matrix")
    out = root / "matrix.json"
    cmd = [sys.executable, "scripts/arch_matrix.py", "--workdir", str(root), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-5000:]
    return {"root": root, "report": json.loads(out.read_text()), "proc": proc}


def test_every_architecture_runs_or_is_refused_before_any_job(matrix):
    rows = {r["arch"]: r for r in matrix["report"]["rows"]}
    assert set(rows) == set(arch_matrix.MATRIX)
    assert {a: r["result"] for a, r in rows.items() if r["result"] not in ("ran", "refused")} == {}
    assert matrix["proc"].returncode == 0, matrix["proc"].stdout[-3000:]
    for arch, row in rows.items():
        if row["result"] == "refused":  # the error names the architecture and what it lacks
            kind = arch_matrix.MATRIX[arch][0]
            assert f"(model_type '{kind}')" in row["refusal"] and "all-linear" in row["refusal"]
            assert "arms/lora.yaml: arm 'lora'" in row["refusal"], row
    for arch in ("qwen3_moe-all-linear", "falcon_h1-all-linear"):
        assert rows[arch]["result"] == "refused", rows[arch]
    table = matrix["proc"].stdout
    assert all(f"{a:<22} {rows[a]['result']}" in table for a in rows), table


def test_each_bundle_passes_its_checks_on_trained_arms_of_its_architecture(matrix):
    for row in matrix["report"]["rows"]:
        if row["result"] != "ran":
            continue
        arch, results = row["arch"], matrix["root"] / "results" / row["arch"]
        assert row["checks"]["reload"] == "RELOAD_CHECK_PASS", row
        assert row["checks"]["evidence"] == "PASS", row
        base = json.loads((matrix["root"] / "bases" / arch / "config.json").read_text())
        assert base["model_type"] == arch
        for arm in ("lora", "full"):
            run = results / f"runs/{arm}/final"
            evidence = json.loads((run / "training_evidence.json").read_text())
            assert evidence["optimizer_steps"] >= 1 and evidence["tokens_seen"] > 0, (arch, arm)
            assert (run / "adapter_config.json").is_file() == (arm == "lora"), (arch, arm)
        for arm in ("base", "lora", "full"):
            assert (results / f"readouts/math/{arm}/greedy.r0.parquet").is_file(), (arch, arm)
        assert (results / "nominations/r1.json").is_file(), arch


def test_each_ran_row_sampled_k_answers_per_prompt_from_its_base_and_verified_each(matrix):
    k = arch_matrix.SAMPLING["k"]
    ran = [r for r in matrix["report"]["rows"] if r["result"] == "ran"]
    assert ran
    for row in ran:
        results = matrix["root"] / "results" / row["arch"]
        pool = io.read_jsonl(results / f"pools/{arch_matrix.SAMPLING['pool']}.jsonl")
        samples = io.read_jsonl(results / arch_matrix.SAMPLES)
        verdicts = io.read_jsonl(results / arch_matrix.VERDICTS)
        assert len(pool) == arch_matrix.PROBE_POOL["n"], row["arch"]
        per_prompt = collections.Counter(s["prompt_id"] for s in samples)
        assert per_prompt == {r["id"]: k for r in pool}, (row["arch"], per_prompt)
        assert row["sampled"]["samples_per_prompt"] == dict(per_prompt), row
        # one verdict per sample, in the samples' order, each a judgement of that sample
        assert [v["id"] for v in verdicts] == [s["id"] for s in samples], row["arch"]
        assert [v["n_tokens"] for v in verdicts] == [s["n_tokens"] for s in samples], row["arch"]
        assert all(isinstance(v["correct"], bool) for v in verdicts), row["arch"]
        assert row["sampled"]["unjudged"] == [], row
        assert all(0 < s["n_tokens"] <= arch_matrix.SAMPLING["max_new_tokens"] for s in samples)
        made = json.loads(manifest.sidecar(results / arch_matrix.SAMPLES).read_text())
        assert made["rows"] == len(samples), row["arch"]
        sampled_as = {key: made["params"][key] for key in arch_matrix.SAMPLING}
        assert sampled_as == arch_matrix.SAMPLING, (row["arch"], sampled_as)


@pytest.mark.parametrize("arch", ["phi3", "qwen3_moe", "falcon_h1"])
def test_a_bundle_reloads_on_its_base_and_answers_as_it_checked(matrix, arch):
    row = next(r for r in matrix["report"]["rows"] if r["arch"] == arch)
    if row["result"] == "refused":
        pytest.skip(f"{arch} was refused: {row['refusal']}")
    assert row["result"] == "ran", row
    bundle = matrix["root"] / "results" / arch / "bundles/lora"
    messages = [
        {"role": "system", "content": (bundle / "system_prompt.txt").read_text()},
        {"role": "user", "content": "Ann has 23 apples and gets 15 more. How many apples now?"},
    ]
    tok, gen, answer = serve_greedy(bundle, matrix["root"] / "bases" / arch, messages, 48)
    stops = gen["eos_token_id"] if isinstance(gen["eos_token_id"], list) else [gen["eos_token_id"]]
    assert answer[-1].item() in stops, tok.decode(answer)
