"""A bundle served by vLLM's offline LLM API answers the reload prompts as the bundle's own
reload check did (greedy), as an adapter where vLLM takes it and as merged/ where it does not.

Needs vLLM and a CUDA GPU; skipped elsewhere, saying which is missing (CI has neither). The
bundle's build runs the same check (arenaflow.bundles.vllm_offline) and its card records whether
it ran."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arenaflow import chat, io
from arenaflow.bundles import build, serving, vllm_offline
from arenaflow.bundles.checks import check_reload

pytestmark = [pytest.mark.gpu]
WHY = vllm_offline.unavailable()
REPO = Path(__file__).resolve().parents[2]
SERVING = {"max_input_tokens": 256, "max_new_tokens": 48, "do_sample": False, "temperature": 0.0,
           "top_p": 1.0, "repetition_penalty": 1.0}  # fmt: skip
PROMPTS = [
    "Ann has 23 apples and gets 15 more. How many apples now?",
    "Cal had 81 coins and gave away 27. How many coins are left?",
]  # config.yaml's B3f
SYSTEM = "You are a careful math tutor."


def make_adapter(base: str, d, head: bool):
    """A rank-8 LoRA adapter with non-zero factors (and a perturbed lm_head in modules_to_save)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    head_module = ["lm_head"] if head else None
    targets = ["q_proj", "v_proj", "down_proj"]
    cfg = LoraConfig(
        r=8, lora_alpha=16, target_modules=targets, modules_to_save=head_module,
        init_lora_weights=False,
    )  # fmt: skip
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.05)
            if "modules_to_save" in name:
                p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(str(d))
    return d


@pytest.mark.skipif(WHY is not None, reason=f"vLLM offline check: {WHY}")
@pytest.mark.parametrize("head", [False, True], ids=["adapter", "merged"])
def test_vllm_answers_as_the_bundles_reload_check(tmp_path, head):
    base = str(REPO / "models/tiny-arith")
    d = make_adapter(base, tmp_path / "X", head)
    tok = build.save_tokenizer(base, chat.CHATML_TEMPLATE, d)
    io.write_json(d / "generation_config.json", build.generation_config(tok, SERVING))
    check_reload(d, base, SERVING, SYSTEM, PROMPTS)
    facts = serving.adapter_facts(d, base)
    if head:
        serving.write_merged(d, base)
    rec = serving.engine_records("X", base, facts, head, SERVING)["vllm"]
    assert rec["use"] == ("merged" if head else "adapter")
    got = vllm_offline.run(d, base, rec, SYSTEM, PROMPTS)
    assert got["verdict"] == "PASS", got["answers"]
