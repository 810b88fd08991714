"""arenaflow.bundles.serving: each engine's verdict on an adapter, the commands, and merged/.

The verdicts are checked against the limits the engines' sources and pages state (vLLM 0.26.0's
--max-lora-rank tops at 512, no engine loads modules_to_save or added vocabulary from an adapter,
vLLM alone LoRA on a Llama's or Qwen3's embedding and head); merged/ against
PEFT's own PeftModel over the base in float32, and reloaded with plain
AutoModelForCausalLM.from_pretrained and the bundle's tokenizer.
"""

from __future__ import annotations

import math
import shlex
import shutil
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_merge import make_adapter

from arenaflow import chat, io, manifest
from arenaflow.bundles import build, serving
from arenaflow.bundles.checks import BundleCheckError
from arenaflow.merge.parents import MergeError
from arenaflow.models import load_base
from arenaflow.servers import fit
from arenaflow.servers.limits import ENGINES

pytest.importorskip("peft")
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

PLAIN = {
    "rank": 8,
    "target_modules": ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"],
    "modules_to_save": [],
    "use_dora": False,
    "bias": "none",
    "rescaled_modules": [],
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
        "(https://github.com/vllm-project/vllm/blob/v0.26.0/vllm/config/lora.py)"
    ]
    assert v["sglang"]["verdict"] == v["tgi"]["verdict"] == "adapter"  # no documented limit
    assert verdicts(rank=512)["vllm"]["verdict"] == "adapter"


def test_added_tokens_an_unknown_target_or_architecture_need_merged_weights():
    for over, text in (
        ({"added_tokens": 3}, "adds 3 tokens"),
        ({"target_modules": ["q_proj", "in_proj"]}, "LoRA on ['in_proj']"),
        ({"architecture": "MambaForCausalLM"}, "LoRA on MambaForCausalLM is not documented"),
        ({"use_dora": True}, "DoRA"),
        ({"bias": "lora_only"}, "bias='lora_only' is not loaded"),
        ({"rescaled_modules": ["q_proj"]}, "rank_pattern/alpha_pattern scale ['q_proj']"),
    ):
        for name, r in verdicts(**over).items():
            assert r["form"] == "merged" and any(text in x for x in r["reasons"]), (name, r)


def test_vllm_serves_lora_on_the_embedding_and_head_of_llama_and_qwen3_only():
    """vLLM 0.26.0's LlamaForCausalLM and Qwen3ForCausalLM list embed_tokens and lm_head in
    their embedding_modules; Mistral's empties it, Qwen2's and Gemma2's have none."""
    for arch, served in (("LlamaForCausalLM", True), ("Qwen3ForCausalLM", True),
                         ("MistralForCausalLM", False), ("Qwen2ForCausalLM", False)):  # fmt: skip
        v = verdicts(architecture=arch, target_modules=["embed_tokens", "lm_head", "q_proj"])
        assert (v["vllm"]["form"] == "adapter") is served, (arch, v["vllm"])
        assert v["sglang"]["form"] == v["tgi"]["form"] == "merged", arch


def test_rescaled_modules_are_those_peft_scales_apart(repo_root):
    """rescaled_modules against PEFT's own per-module scaling on the tiny model: a pattern that
    leaves alpha / r as it is (q_proj) is not one."""
    cfg = {"r": 8, "lora_alpha": 16, "rank_pattern": {"q_proj": 4, "k_proj": 16},
           "alpha_pattern": {"q_proj": 8, "v_proj": 8}}  # fmt: skip
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    for rslora in (False, True):
        model = load_base(str(repo_root / "models/tiny-arith"))
        peft = get_peft_model(model, LoraConfig(**cfg, use_rslora=rslora, target_modules=targets))
        top = cfg["lora_alpha"] / (math.sqrt(8) if rslora else 8)
        scalings = {n.rsplit(".", 1)[-1]: m.scaling["default"]
                    for n, m in peft.named_modules() if isinstance(m, LoraLayer)}  # fmt: skip
        apart = sorted(k for k, x in scalings.items() if not math.isclose(x, top))
        got = fit.rescaled_modules({**cfg, "use_rslora": rslora})
        assert got == apart, (rslora, got, scalings)
        assert ("q_proj" in got) is rslora  # 8/sqrt(4) != 16/sqrt(8); 8/4 == 16/8


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
    # vLLM's LoRA kernels take float16/bfloat16 only; the merged weights serve in float32
    lora_dtype = plain["vllm"]["adapter"]["argv"].index("--dtype") + 1
    assert plain["vllm"]["adapter"]["argv"][lora_dtype] == "bfloat16"
    assert plain["vllm"]["note"].startswith(
        "served in bfloat16: vLLM 0.26.0's LoRA kernels take no float32 (https://github.com/"
    )
    merged = records["vllm"]["merged"]["argv"]
    assert facts["dtype"] == "float32" == merged[merged.index("--dtype") + 1]
    assert "note" not in records["vllm"] and "note" not in plain["sglang"]


def test_lora_on_a_tied_embedding_folds_as_peft_serves_it(repo_root, tmp_path):
    """PEFT's embedding LoRA leaves a tied head on the base's embedding (its merge_and_unload
    would tie the head to the merged one instead): merged/ writes the head apart and unties it."""
    base = str(repo_root / "models/tiny-arith")
    d = make_adapter(base, tmp_path / "E", 8, r=4, targets=("embed_tokens", "q_proj"))
    build.save_tokenizer(base, chat.CHATML_TEMPLATE, d)
    facts = serving.adapter_facts(d, base)
    assert facts["target_modules"] == ["embed_tokens", "q_proj"]
    forms = {n: serving.engine_verdict(n, facts)["form"] for n in ENGINES}
    assert forms == {"vllm": "adapter", "sglang": "merged", "tgi": "merged"}
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


def grown_adapter(base: str, d, saved: list[str]):
    """A LoRA adapter over the base with two rows added to its vocabulary (as an installed chat
    template's tokens leave it: models.fit_embeddings), `saved` in modules_to_save and perturbed;
    returns the PEFT model in memory, the only holder of the resized base's unsaved new rows."""
    torch.manual_seed(5)
    model = load_base(base)
    model.resize_token_embeddings(model.get_input_embeddings().weight.shape[0] + 2)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], modules_to_save=saved,
                     init_lora_weights=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT's note on a tied layer in modules_to_save
        peft = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "modules_to_save" in name:
                p.add_(torch.randn_like(p) * 0.05)
    peft.save_pretrained(str(d))
    manifest.write(d, extra={"arm": d.name})
    return peft.eval()


def test_a_grown_vocabulary_folds_into_merged_weights_of_its_size(repo_root, tmp_path):
    base = str(repo_root / "models/tiny-arith")
    ref = grown_adapter(base, tmp_path / "G", ["embed_tokens", "lm_head"])
    info = serving.fold.fold(tmp_path / "G", base, tmp_path / "m")
    rows = io.read_json(f"{base}/config.json")["vocab_size"] + 2
    assert info["grown_vocab_size"] == rows
    cfg = io.read_json(tmp_path / "m/config.json")
    assert cfg["vocab_size"] == rows and cfg["tie_word_embeddings"] is False
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m")).eval()
    ids = torch.randint(0, rows, (2, 24), generator=torch.Generator().manual_seed(0))
    ids[:, -2:] = torch.tensor([rows - 2, rows - 1])  # the new tokens, in and out
    with torch.no_grad():
        diff = (ref(input_ids=ids).logits - merged(input_ids=ids).logits).abs().max()
    assert merged.get_output_embeddings().weight.shape[0] == rows and diff < 1e-4


def test_a_grown_vocabulary_without_the_heads_copy_or_of_another_shape_is_refused(
    repo_root, tmp_path
):
    base = str(repo_root / "models/tiny-arith")
    grown_adapter(base, tmp_path / "E", ["embed_tokens"])
    with pytest.raises(MergeError, match=r"tensor base_model.model.lm_head.weight is neither"):
        serving.fold.fold(tmp_path / "E", base, tmp_path / "m")  # PEFT saved the resized head
    f = tmp_path / "E/adapter_model.safetensors"
    save_file({k: t for k, t in load_file(f).items() if "lm_head" not in k}, f)
    with pytest.raises(MergeError, match=r"no copy of \['lm_head.weight'\]"):
        serving.fold.fold(tmp_path / "E", base, tmp_path / "m")  # the tied head's rows unknown
    assert not (tmp_path / "m").exists()
    grown_adapter(base, tmp_path / "H", ["embed_tokens", "lm_head"])
    f = tmp_path / "H/adapter_model.safetensors"
    save_file(
        {k: t[:, :-1].contiguous() if "lm_head" in k else t for k, t in load_file(f).items()}, f
    )
    with pytest.raises(MergeError, match=r"tensor .*lm_head.* has shape \[261, 127\]"):
        serving.fold.fold(tmp_path / "H", base, tmp_path / "m")
