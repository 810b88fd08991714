"""arenaflow.decode.vllm_engine without vLLM: our decoding settings as vLLM's SamplingParams
arguments (held to transformers' generate() arguments, which the other engines follow), the
seeds of a call's requests, a completion's tokens as the other engines count them, the adapter
or merged weights by the bundles' own vLLM verdict, and the refusal of `decoder: vllm` where vLLM
cannot be imported. Decoding through vLLM is tests/gpu/test_vllm_sampling.py's (a GPU host)."""

from __future__ import annotations

import importlib.util
import json
import re
from types import SimpleNamespace

import pytest
from test_merge import make_adapter

from arenaflow import io, models
from arenaflow.decode import sampling, vllm_engine
from arenaflow.servers import fit

pytest.importorskip("peft")
NO_VLLM = importlib.util.find_spec("vllm") is None
STOPS = [2, 7]


@pytest.mark.parametrize(
    "dec",
    [
        sampling.Decoding(temperature=0.0, max_new_tokens=24),
        sampling.Decoding(temperature=0.8, top_p=0.95, max_new_tokens=64, repetition_penalty=1.1),
    ],
    ids=["greedy", "sampled"],
)
def test_sampling_params_are_the_decoding_generate_would_run(dec):
    """Every setting transformers' generate() gets from a Decoding reaches vLLM under vLLM's name
    (greedy: temperature 0; sampling: top_k 0, which both read as no top-k), with k, the seed,
    the token budget and the stop tokens, and no text decoded by vLLM."""
    got = vllm_engine.sampling_kwargs(dec, 8, 123, STOPS)
    hf = dec.generate_kwargs()
    assert got["temperature"] == (hf["temperature"] if hf["do_sample"] else 0.0)
    for key in ("top_p", "top_k", "repetition_penalty"):
        assert got.get(key) == hf.get(key), key
    assert (got["n"], got["seed"], got["max_tokens"]) == (8, 123, dec.max_new_tokens)
    assert got["stop_token_ids"] == STOPS and got["detokenize"] is False


def test_every_sample_of_a_call_draws_from_a_seed_of_its_own_and_a_rerun_the_same():
    """vLLM seeds a request's sample j with the request's seed + j: over 50 prompts x k = 8 the
    seeds are 400 distinct values, the same on a rerun, and another corpus seed moves them."""

    def seeds(seed):
        return [vllm_engine.request_seed(seed, i, 8) + j for i in range(50) for j in range(8)]

    assert len(set(seeds(7))) == 400 and seeds(7) == seeds(7)
    assert seeds(7) != seeds(8)


def completion(ids, reason, stop_reason=None):
    return SimpleNamespace(token_ids=ids, finish_reason=reason, stop_reason=stop_reason)


def test_a_completion_counts_its_stop_token_as_the_other_engines_do(repo_root):
    """The samples record (sampling._sample) of vLLM's completions: one that kept its stop token
    and one whose stop token only its stop_reason names give the same n_tokens and stopped; one
    cut by the token budget is not stopped."""
    tok = models.load_tokenizer(repo_root / "models/tiny-arith")
    stops = sampling.stop_token_ids(tok)
    words = tok("12 + 3 = 15", add_special_tokens=False)["input_ids"]
    kept = vllm_engine.completion_ids(completion([*words, stops[0]], "stop", stops[0]), stops)
    named = vllm_engine.completion_ids(completion(list(words), "stop", stops[0]), stops)
    budget = vllm_engine.completion_ids(completion(list(words), "length"), stops)
    assert kept == named == [*words, stops[0]] and budget == words
    a, b = (sampling._sample(tok, ids, stops) for ids in (kept, budget))
    assert a == {"text": tok.decode(words), "n_tokens": len(words) + 1, "stopped": True}
    assert (b["n_tokens"], b["stopped"]) == (len(words), False)


@pytest.fixture(scope="module")
def base(repo_root):
    return str(repo_root / "models/tiny-arith")


def test_a_plain_adapter_is_served_as_a_lora_request_at_the_smallest_rank_that_holds_it(
    base, tmp_path
):
    d = make_adapter(base, tmp_path / "A", 1, r=4)
    form = vllm_engine.choose_form(base, d)
    assert form == {"form": "adapter", "reasons": [], "max_lora_rank": 8}


def test_an_adapter_vllm_refuses_is_served_as_merged_weights_saying_why(base, tmp_path):
    """lm_head in modules_to_save (lineage 000's arms): vLLM's peft_helper refuses it, as the
    bundle's own vLLM verdict says."""
    d = make_adapter(base, tmp_path / "H", 2, r=4, head=True)
    form = vllm_engine.choose_form(base, d)
    assert form["form"] == "merged" and form["max_lora_rank"] is None
    assert any("modules_to_save ['lm_head']" in r for r in form["reasons"]), form
    assert (
        form["reasons"] == fit.engine_verdict("vllm", fit.adapter_facts(d, base, base))["reasons"]
    )


def test_the_base_and_a_full_fine_tune_load_as_plain_weights(base, tmp_path):
    full = tmp_path / "F"
    full.mkdir()
    io.write_json(full / "config.json", {})  # weights without adapter_config.json
    assert vllm_engine.choose_form(base, None)["form"] == "base"
    assert vllm_engine.choose_form(base, full)["form"] == "full"


@pytest.mark.skipif(not NO_VLLM, reason="vLLM is installed here: nothing to refuse")
def test_decoder_vllm_without_vllm_stops_the_sampling_job_naming_it_and_the_install(base, tmp_path):
    from arenaflow import candidates

    pool = tmp_path / "pool.jsonl"
    io.write_jsonl(pool, [{"id": "m1", "category": "add", "prompt": "1 + 1?", "gold": "2"}])
    out = tmp_path / "candidates" / "c" / "samples.jsonl"
    params = {"k": 2, "engine": {"decoder": "vllm"}}
    argv = ["sample", "--pool", str(pool), "--base-model", base, "--out", str(out)]
    with pytest.raises(vllm_engine.VllmMissing) as e:
        candidates.main([*argv, "--params-json", json.dumps(params)])
    msg = str(e.value)
    assert msg.startswith(f"{out}: engine decoder 'vllm'") and "arenaflow[vllm]" in msg
    assert "No module named 'vllm'" in msg and not out.exists()


@pytest.mark.skipif(not NO_VLLM, reason="vLLM is installed here: nothing to refuse")
def test_decoder_vllm_without_vllm_stops_the_readout_job_naming_it(base, tmp_path):
    from arenaflow.evals import readout

    pool = tmp_path / "pool.jsonl"
    io.write_jsonl(pool, [{"id": "m1", "category": "add", "prompt": "1 + 1?", "gold": "2"}])
    out = tmp_path / "greedy.r0.parquet"
    argv = ["readout", "--suite", "math", "--arm", "base", "--pool", str(pool), "--base-model"]
    argv += [base, "--regime-json", '{"temperature": 0.0}', "--out", str(out)]
    with pytest.raises(
        vllm_engine.VllmMissing, match=f"^{re.escape(str(out))}: .*arenaflow\\[vllm\\]"
    ):
        readout.main([*argv, "--engine-json", '{"decoder": "vllm"}'])
    assert not out.exists()


def test_the_samples_manifest_records_the_decoder_that_drew_them(base, tmp_path):
    from arenaflow import candidates, manifest

    pool = tmp_path / "pool.jsonl"
    io.write_jsonl(pool, [{"id": "m1", "category": "add", "prompt": "1 + 1?", "gold": "2"}])
    out = tmp_path / "samples.jsonl"
    params = {"k": 2, "max_new_tokens": 4, "engine": {"decoder": "hf"}}
    argv = ["sample", "--pool", str(pool), "--base-model", base, "--out", str(out)]
    candidates.main([*argv, "--params-json", json.dumps(params)])
    record = io.read_json(manifest.sidecar(out))
    assert record["params"]["decoded_by"] == {"decoder": "hf"}
    assert vllm_engine.describe("static") == {"decoder": "static"}
