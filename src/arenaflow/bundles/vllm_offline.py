"""The bundle served by vLLM's offline LLM API, its greedy answers against the reload check's.

Runs where vLLM is installed and a CUDA device is present (a GPU host); elsewhere it reports
NOT_RUN and why, which the model card records. The form served is the one serving_config.json
tells vLLM to use: the adapter over the base (LoRARequest), or merged/.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from arenaflow import chat, io, models


def unavailable() -> str | None:
    """Why vLLM cannot run here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install vllm, on a GPU host)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def run(bundle: Path, base_model: str, record: dict, system_prompt: str, prompts) -> dict:
    """{verdict: PASS | FAIL | NOT_RUN, detail, answers}: vLLM's greedy answer to each reload
    prompt, rendered with the bundle's chat template, against reload_check.json's output."""
    why = unavailable()
    if why:
        return {"verdict": "NOT_RUN", "detail": f"vLLM offline check not run: {why}"}
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    use = record["use"]
    gen = io.read_json(bundle / "generation_config.json")
    # the reload check's dtype (arenaflow.models.dtype_for a CUDA device), so that both read the
    # same weights
    dtype = str(models.dtype_for(models.device())).removeprefix("torch.")
    if use == "adapter":
        llm = LLM(
            model=base_model, dtype=dtype, enable_lora=True, max_lora_rank=record["max_lora_rank"]
        )
        lora = LoRARequest("bundle", 1, str(bundle))
    else:
        model = bundle / ("merged" if use == "merged" else ".")
        llm, lora = LLM(model=str(model), dtype=dtype), None
    params = SamplingParams(
        temperature=0.0,
        max_tokens=gen["max_new_tokens"],
        stop_token_ids=gen["eos_token_id"],
    )
    template = (bundle / "chat_template.jinja").read_text(encoding="utf-8")
    convs = [chat.prompt_messages(system_prompt, p) for p in prompts]
    outs = llm.chat(convs, params, chat_template=template, lora_request=lora)
    want = [o["output"] for o in io.read_json(bundle / "reload_check.json")["outputs"]]
    got = [o.outputs[0].text for o in outs]
    same = [a.strip() == b.strip() for a, b in zip(got, want)]
    return {
        "verdict": "PASS" if all(same) else "FAIL",
        "detail": f"vLLM ({use}) greedy answers equal the reload check's on {sum(same)}/"
        f"{len(same)} prompts",
        "answers": [{"prompt": p, "vllm": g, "bundle": w} for p, g, w in zip(prompts, got, want)],
    }
