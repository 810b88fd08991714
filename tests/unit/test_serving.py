"""arenaflow.bundles.serving: each engine's verdict on an adapter, the commands, and merged/.

The verdicts are checked against the limits the engines' pages state (vLLM's --max-lora-rank
tops at 512, no engine loads modules_to_save or added vocabulary from an adapter); merged/ against
PEFT's own PeftModel over the base in float32, and reloaded with plain
AutoModelForCausalLM.from_pretrained and the bundle's tokenizer.
"""

from __future__ import annotations

import shlex
import shutil

import pytest
import torch
from test_merge import make_adapter

from arenaflow import chat, io
from arenaflow.bundles import build, serving
from arenaflow.bundles.checks import BundleCheckError
from arenaflow.servers.limits import ENGINES

pytest.importorskip("peft")
from peft import PeftModel  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

PLAIN = {
    "rank": 8,
    "target_modules": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    "modules_to_save": [],
    "use_dora": False,
    "added_tokens": 0,
    "architecture": "LlamaForCausalLM",
    "dtype": "float32",
}
SERVING = {"max_input_tokens": 256, "max_new_tokens": 12, "do_sample": False, "temperature": 0.0,
           "top_p": 1.0, "repetition_penalty": 1.0}  # fmt: skip
PROMPTS = ["Ann has 23 apples and gets 15 more. How many apples now?", "What is 7 * 6?"]


def verdicts(**over) -> dict:
    return {n: serving.engine_verdict(n, {**PLAIN, **over}) for n in ENGINES}


def test_a_plain_rank_8_adapter_is_served_as_an_adapter_by_every_engine():
    v = verdicts()
    assert {n: r["verdict"] for n, r in v.items()} == dict.fromkeys(ENGINES, "adapter")
    assert v["vllm"]["max_lora_rank"] == 8  # the smallest --max-lora-rank choice that holds it
    assert verdicts(rank=100)["vllm"]["max_lora_rank"] == 128


def test_modules_to_save_needs_merged_weights_on_every_engine():
    for name, r in verdicts(modules_to_save=["lm_head"]).items():
        assert r["verdict"] == "merged weights needed", name
        assert any("modules_to_save ['lm_head']" in x for x in r["reasons"]), r
    vllm = verdicts(modules_to_save=["lm_head"])["vllm"]["reasons"][0]
    assert "vllm/lora/peft_helper.py" in vllm  # the source that refuses it


def test_rank_768_is_above_vllms_largest_max_lora_rank_only():
    v = verdicts(rank=768)
    assert v["vllm"]["verdict"] == "merged weights needed"
    assert v["vllm"]["reasons"] == [
        "rank 768 is above --max-lora-rank's largest choice 512 "
        "(https://docs.vllm.ai/en/latest/configuration/engine_args.html)"
    ]
    assert v["sglang"]["verdict"] == v["tgi"]["verdict"] == "adapter"  # no documented limit
    assert verdicts(rank=512)["vllm"]["verdict"] == "adapter"


def test_added_tokens_an_unknown_target_or_architecture_need_merged_weights():
    for over, text in (
        ({"added_tokens": 3}, "adds 3 tokens"),
        ({"target_modules": ["q_proj", "lm_head"]}, "LoRA on ['lm_head']"),
        ({"architecture": "MambaForCausalLM"}, "LoRA on MambaForCausalLM is not documented"),
        ({"use_dora": True}, "DoRA"),
    ):
        for name, r in verdicts(**over).items():
            assert r["form"] == "merged" and any(text in x for x in r["reasons"]), (name, r)


def test_merged_is_built_when_an_engine_needs_it_or_asked():
    needs = {n: {"form": "merged"} for n in ENGINES}
    fine = {n: {"form": "adapter"} for n in ENGINES}
    assert serving.wants_merged("auto", needs) and not serving.wants_merged("auto", fine)
    assert serving.wants_merged("always", fine) and not serving.wants_merged("never", needs)


@pytest.fixture(scope="module")
def bundle(repo_root, tmp_path_factory):
    """A bundle's serving files around an adapter that no engine serves as it is (lm_head in
    modules_to_save, over a base whose head is tied), with merged/ and its check."""
    base = str(repo_root / "models/tiny-arith")
    d = tmp_path_factory.mktemp("head") / "X"
    make_adapter(base, d, 7, r=4, head=True)
    tok = build.save_tokenizer(base, chat.CHATML_TEMPLATE, d)
    io.write_json(d / "generation_config.json", build.generation_config(tok, SERVING))
    facts = serving.adapter_facts(d, base)
    records = serving.engine_records("X", base, facts, False, SERVING)
    assert serving.wants_merged("auto", records)
    serving.write_merged(d, base)
    check = serving.check_merged(d, base, "Be brief.", PROMPTS, SERVING["max_new_tokens"])
    return d, base, facts, serving.engine_records("X", base, facts, True, SERVING), check


def test_merged_reloads_plainly_and_equals_the_adapter_model(bundle):
    d, base, _, _, check = bundle
    assert check["verdict"] == "PASS"
    tok = AutoTokenizer.from_pretrained(str(d))  # the bundle's tokenizer
    merged = AutoModelForCausalLM.from_pretrained(str(d / "merged"), dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    ref = PeftModel.from_pretrained(ref, str(d)).eval()
    stops = io.read_json(d / "generation_config.json")["eos_token_id"]
    for p in PROMPTS[:1]:  # check_merged ran both; one, independently
        ids = tok.apply_chat_template(
            chat.prompt_messages("Be brief.", p), add_generation_prompt=True, return_tensors="pt"
        )["input_ids"]
        kw = {"max_new_tokens": 12, "do_sample": False, "eos_token_id": stops, "pad_token_id": 0}
        with torch.no_grad():
            a, b = ref.generate(input_ids=ids, **kw), merged.generate(input_ids=ids, **kw)
            diff = (ref(input_ids=a).logits - merged(input_ids=a).logits).abs().max()
        assert a.tolist() == b.tolist()
        assert diff < 1e-4  # float32 rounding: ~4e-5 measured on logits of ~18
    rec = io.read_json(d / "merged_check.json")
    assert all(r["adapter_ids"] == r["merged_ids"] for r in rec["prompts"])


def test_merged_holds_the_bundles_serving_files_and_unties_a_changed_head(bundle):
    d = bundle[0]
    for f in serving.SERVED_FILES:
        if (d / f).exists():
            assert (d / "merged" / f).read_bytes() == (d / f).read_bytes(), f
    assert io.read_json(d / "merged/config.json")["tie_word_embeddings"] is False
    with pytest.raises(BundleCheckError, match="not base \\+ adapter"):  # a wrong fold is caught
        cfg = io.read_json(d / "adapter_config.json")
        io.write_json(d / "adapter_config.json", {**cfg, "lora_alpha": cfg["lora_alpha"] * 3})
        try:
            serving.check_merged(d, bundle[1], "", PROMPTS[:1], 4)
        finally:
            io.write_json(d / "adapter_config.json", cfg)


def test_every_command_names_bundle_files_and_documented_flags_only(bundle):
    d, base, facts, records, _ = bundle
    assert facts["modules_to_save"] or "embed_tokens" in facts["target_modules"]
    for name, rec in records.items():
        assert rec["use"] == "merged" and "adapter" not in rec
        cmd = rec["merged"]
        launcher = ENGINES[name]["launcher"]
        assert cmd["argv"][: len(launcher)] == launcher
        assert shlex.split(cmd["command"]) == cmd["argv"]
        flags = [a for a in cmd["argv"] if a.startswith("--")]
        assert set(flags) <= set(ENGINES[name]["flags"]), name
        for p in cmd["paths"]:
            assert (d / p).exists(), (name, p)
            assert p in cmd["argv"], (name, p)
    plain = serving.engine_records("X", base, {**facts, **PLAIN}, True, SERVING)
    for name, rec in plain.items():
        assert rec["use"] == "adapter"
        flags = [a for a in rec["adapter"]["argv"] if a.startswith("--")]
        assert set(flags) <= set(ENGINES[name]["flags"]), name
        for p in rec["adapter"]["paths"]:
            assert (d / p).exists() and any(a in (p, f"X={p}") for a in rec["adapter"]["argv"])
    assert plain["vllm"]["adapter"]["argv"][2] == base
    assert plain["tgi"]["note"] == "served in bfloat16: --dtype has no float32"


def test_lora_on_a_tied_embedding_folds_as_peft_serves_it(repo_root, tmp_path):
    """PEFT's embedding LoRA leaves a tied head on the base's embedding (its merge_and_unload
    would tie the head to the merged one instead): merged/ writes the head apart and unties it."""
    base = str(repo_root / "models/tiny-arith")
    d = make_adapter(base, tmp_path / "E", 8, r=4, targets=("embed_tokens", "q_proj"))
    build.save_tokenizer(base, chat.CHATML_TEMPLATE, d)
    assert serving.engine_verdict("vllm", serving.adapter_facts(d, base))["form"] == "merged"
    serving.fold.fold(d, base, tmp_path / "m")
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(d)).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m")).eval()
    with torch.no_grad():
        diff = (ref(input_ids=ids).logits - merged(input_ids=ids).logits).abs().max()
    assert diff < 1e-4 and not merged.config.tie_word_embeddings


def test_a_full_fine_tune_is_served_as_the_model_it_is(bundle):
    d = bundle[0]
    for name, rec in serving.engine_records("X", "b", None, False, SERVING).items():
        assert rec["use"] == "model" and rec["model"]["argv"][: len(ENGINES[name]["launcher"])]
        assert set(a for a in rec["model"]["argv"] if a.startswith("--")) <= set(
            ENGINES[name]["flags"]
        )
        assert all((d / p).exists() for p in rec["model"]["paths"])


def test_an_adapter_the_fold_cannot_read_fails_the_bundle_by_name(bundle, tmp_path):
    d = tmp_path / "Y"
    shutil.copytree(bundle[0], d, ignore=shutil.ignore_patterns("merged"))
    cfg = io.read_json(d / "adapter_config.json")
    io.write_json(d / "adapter_config.json", {**cfg, "use_dora": True})
    with pytest.raises(BundleCheckError, match="merged/ cannot be built: .*use_dora=True"):
        serving.write_merged(d, bundle[1])
