"""Base models the repository builds or imports itself: the tiny Llamas of the embedded
defaults, and SmolLM2-135M-Instruct from its wheel."""

import json
from pathlib import Path


def not_a_model(path: str | Path) -> str | None:
    """Why the directory `path`, a PEFT adapter's, is not a model (None: it is no adapter, or it
    has a config.json of its own): named with the base it was trained on. Given one,
    transformers would fetch that base from the Hugging Face Hub, which a job here cannot reach
    and which would make the base something no config names."""
    path = Path(path)
    adapter = path / "adapter_config.json"
    if adapter.is_file() and not (path / "config.json").is_file():
        try:
            on = json.loads(adapter.read_text()).get("base_model_name_or_path")
        except (OSError, ValueError, AttributeError):
            on = None
        return (
            f"{path} is a PEFT adapter (adapter_config.json) on base {on!r}, not a model; set "
            "the base to that base model's own directory (with its config.json)"
        )
    return None


# PEFT refuses LoRA on these modules of these model types as it wraps the model
# (peft.tuners.tuners_utils._check_lora_target_modules_mamba, peft 0.17-0.21)
MAMBA_MODEL_TYPES = {"falcon_h1", "mamba", "mamba2", "falcon_mamba", "nemotron_h"}
MAMBA_REFUSED = {"out_proj", "conv1d"}


def lora_refusal(path: str | Path, targets: list[str]) -> str | None:
    """Why LoRA on `targets` cannot make a bundle of the base at `path` (None: nothing known
    against it), from its config.json alone: a Mamba mixer's out_proj or conv1d, which PEFT
    refuses; all-linear on a MoE whose experts transformers holds as fused 3-D parameters,
    which PEFT then adapts as parameters (target_parameters) that arenaflow's merge and no
    serving engine can take."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # the job that loads the base says what is wrong with it
    kind = cfg.get("model_type")
    arch = f"{(cfg.get('architectures') or [kind])[0]} (model_type {kind!r})"
    if kind in MAMBA_MODEL_TYPES:
        bad = sorted(MAMBA_REFUSED & set(targets)) or (
            ["all-linear"] if "all-linear" in targets else []
        )
        if bad:
            return (
                f"{arch} has Mamba mixers, whose {sorted(MAMBA_REFUSED)} PEFT's LoRA refuses; "
                f"target {bad} includes them: name the attention layers (q_proj, k_proj, "
                "v_proj, o_proj) and the mixer's in_proj instead"
            )
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    if experts > 1 and "all-linear" in targets:
        return (
            f"{arch} is a MoE of {experts} experts held as fused parameters: all-linear adapts "
            "them as parameters (PEFT's target_parameters), which arenaflow's merge and no "
            "serving engine can take; name the attention layers (q_proj, k_proj, v_proj, o_proj)"
        )
    return None
