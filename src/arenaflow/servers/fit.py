"""Whether an engine serves a LoRA adapter as it is, from the limits it documents
(arenaflow.servers.limits): "adapter", or "merged weights needed" and why.

Read by arenaflow.bundles.serving (which writes the verdicts into a bundle) and by
arenaflow.decode.vllm_engine (which asks it of a policy's adapter before serving it).
"""

from __future__ import annotations

import math
from pathlib import Path

from safetensors import safe_open

from arenaflow import io, models
from arenaflow.servers.limits import ENGINES


def adapter_facts(bundle: Path, base_model: str, tokenizer: str | Path | None = None) -> dict:
    """What the engines' limits are checked against: the adapter's rank (the largest of r and its
    rank_pattern), targets, modules_to_save, DoRA, its bias setting, the rank_pattern/alpha_pattern
    keys whose scaling is not r and lora_alpha's, the vocabulary it adds (beyond `tokenizer`'s,
    by default the bundle's own), the base's architecture and dtype."""
    cfg = io.read_json(bundle / models.ADAPTER_CONFIG)
    base = io.read_json(Path(base_model) / "config.json")
    text = base.get("text_config", base)
    targets = cfg.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else targets
    with safe_open(str(bundle / models.ADAPTER_WEIGHTS), framework="pt") as f:
        rows = [f.get_slice(k).get_shape()[0] for k in f.keys() if _vocab_tensor(k)]
    vocab = max([len(models.load_tokenizer(tokenizer or bundle)), *rows])
    return {
        "rank": max([cfg["r"], *(cfg.get("rank_pattern") or {}).values()]),
        "target_modules": sorted({t.rsplit(".", 1)[-1] for t in targets}),
        "modules_to_save": sorted(cfg.get("modules_to_save") or []),
        "use_dora": bool(cfg.get("use_dora")),
        "bias": str(cfg.get("bias") or "none"),
        "rescaled_modules": rescaled_modules(cfg),
        "added_tokens": max(0, vocab - text["vocab_size"]),
        "architecture": (base.get("architectures") or ["?"])[0],
        "dtype": str(base.get("dtype") or base.get("torch_dtype") or "auto"),
    }


def rescaled_modules(cfg: dict) -> list[str]:
    """The rank_pattern/alpha_pattern keys that give their modules another scaling than
    lora_alpha / r (/ sqrt(r) with rsLoRA): what an engine reading r and lora_alpha alone gets
    wrong."""
    ranks, alphas = cfg.get("rank_pattern") or {}, cfg.get("alpha_pattern") or {}
    root = math.sqrt if cfg.get("use_rslora") else float

    def scale(key: str | None) -> float:
        return alphas.get(key, cfg["lora_alpha"]) / root(ranks.get(key, cfg["r"]))

    return sorted(k for k in {*ranks, *alphas} if not math.isclose(scale(k), scale(None)))


def _vocab_tensor(key: str) -> bool:
    """A tensor whose first dimension is the vocabulary: a saved head or input embedding."""
    return key.endswith(("lm_head.weight", "embed_tokens.weight"))


def engine_verdict(name: str, facts: dict) -> dict:
    """{verdict, form, reasons, max_lora_rank}: 'adapter' when the engine documents serving this
    adapter as it is, else 'merged weights needed' and each reason, with the page stating it."""
    e, arch = ENGINES[name], facts["architecture"]
    doc = e["docs"]["lora"]
    reasons = []
    allowed = e["lora_targets"].get(arch)
    if allowed is None:
        reasons.append(f"LoRA on {arch} is not documented ({doc}, {e['version']})")
    elif set(facts["target_modules"]) - set(allowed):
        extra = sorted(set(facts["target_modules"]) - set(allowed))
        reasons.append(f"LoRA on {extra} is not served (targets: {allowed}; {doc})")
    if facts["modules_to_save"] and not e["modules_to_save"]:
        reasons.append(
            f"modules_to_save {facts['modules_to_save']} (trained in full) is not loaded "
            f"from an adapter ({e['docs'].get('peft_helper', doc)})"
        )
    if facts["use_dora"] and not e["dora"]:
        reasons.append(f"DoRA adapters are not supported ({e['docs'].get('peft_helper', doc)})")
    if facts["bias"] != "none" and not e["bias"]:
        reasons.append(
            f"bias={facts['bias']!r} is not loaded ({e['docs'].get('peft_helper', doc)})"
        )
    if facts["rescaled_modules"] and not e["per_module_scaling"]:
        reasons.append(
            f"rank_pattern/alpha_pattern scale {facts['rescaled_modules']} apart from "
            f"lora_alpha / r, which the engine applies to every module "
            f"({e['docs'].get('patterns', e['docs'].get('adapters', doc))})"
        )
    if facts["added_tokens"] and not e["added_tokens"]:
        reasons.append(
            f"the adapter adds {facts['added_tokens']} tokens to the vocabulary "
            f"({e['docs'].get('added_tokens', doc)})"
        )
    choices = e["max_lora_rank_choices"]
    rank = facts["rank"]
    if choices and rank > max(choices):
        reasons.append(
            f"rank {rank} is above --max-lora-rank's largest choice {max(choices)} "
            f"({e['docs']['args']})"
        )
    fits = [c for c in choices or [] if c >= rank]
    return {
        "verdict": "merged weights needed" if reasons else "adapter",
        "form": "merged" if reasons else "adapter",
        "reasons": reasons,
        "max_lora_rank": fits[0] if fits else rank,
    }
