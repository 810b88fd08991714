"""The model an arm trains, its optimizer parameter groups, and a ZeRO-3-safe save.

LoRA: an arm from `base` gets a fresh adapter with the configured geometry; an arm from another
arm continues that arm's adapter as trainable (geometry comes from the adapter). Full
fine-tuning: an arm from `base` starts from the base weights, one from an arm from its saved
weights. modules_to_save (e.g. lm_head) may have its own learning rate, as in lineage 000
(docs/lineages.md#000-lineage-and-corpora).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from arenaflow import manifest, models


def build(base_model: str, init: str, hyper: dict, arm: str = "the arm", tokenizer=None):
    """The module to train, with requires_grad set; its embeddings fit to `tokenizer` (ChatML
    installed on a base without its tokens: models.fit_embeddings), whose new rows a LoRA arm
    trains only through modules_to_save (check_new_rows)."""
    if init != "base" and not Path(init).is_dir():
        raise SystemExit(f"init {init!r} is neither 'base' nor a trained arm's directory")
    if init != "base":  # before anything of it is loaded: a changed adapter fails here, by name
        manifest.require(init, "training (init arm)")
    if hyper["method"] == "full":
        if init != "base" and models.is_adapter(init):
            raise SystemExit(f"full fine-tuning cannot continue the LoRA adapter in {init}")
        model = models.load_base(base_model if init == "base" else init)
        model = models.fit_embeddings(model, tokenizer) if tokenizer is not None else model
        model.config.use_cache = False
        return model
    from peft import PeftModel, get_peft_model

    if init != "base":
        if not models.is_adapter(init):
            raise SystemExit(
                f"a LoRA arm cannot continue {init}: it holds full weights, not an adapter"
            )
        base = _fitted(models.load_base(base_model), tokenizer, hyper["lora"], arm)
        return PeftModel.from_pretrained(base, init, is_trainable=True)
    model = _fitted(models.load_base(base_model), tokenizer, hyper["lora"], arm)
    check_targets(model, hyper["lora"], f"arm {arm}", base_model)
    return get_peft_model(model, lora_config(hyper["lora"]))


def _fitted(model, tokenizer, lora: dict, arm: str):
    """The base with its embeddings fit to `tokenizer`; a LoRA arm whose tokenizer grew must
    train the new rows, which LoRA's low-rank update of a linear layer cannot reach."""
    if tokenizer is None:
        return model
    rows = model.get_input_embeddings().weight.shape[0]
    model = models.fit_embeddings(model, tokenizer)
    if len(tokenizer) > rows:
        names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
        want = {"embed_tokens" if "embed_tokens" in names else "the input embedding"}
        if not model.config.tie_word_embeddings:
            want.add("lm_head")
        if not want <= set(lora.get("modules_to_save") or []):
            raise SystemExit(
                f"arm {arm}: base.chat_template added {len(tokenizer) - rows} tokens to the base's "
                f"tokenizer; a LoRA arm trains their new embedding rows only through "
                f"lora.modules_to_save: {sorted(want)} (or train the arm with method: full)"
            )
    return model


ALL_LINEAR = "all-linear"  # PEFT's spelling: every linear layer but the output head


def linear_names(model) -> list[str]:
    """The distinct last names of `model`'s linear layers: what target_modules can name (q_proj,
    Phi-3's qkv_proj, GPT-NeoX's query_key_value, ...)."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers, which PEFT adapts

    kinds = (torch.nn.Linear, Conv1D)
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, kinds)})


def check_targets(model, lora: dict, who: str, base_model: str) -> None:
    """Refuses, before PEFT and any step, a target_modules or modules_to_save name that matches
    no module of the base, naming `who` and the linear layers the base has."""
    targets = list(lora["target_modules"])
    if ALL_LINEAR in targets and len(targets) > 1:
        raise SystemExit(
            f"{who}: lora target_modules {targets}: '{ALL_LINEAR}' stands alone (it already "
            "names every linear layer but the output head)"
        )
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    wanted = [t for t in targets if t != ALL_LINEAR] + list(lora.get("modules_to_save") or [])
    unknown = sorted(set(wanted) - names)
    if unknown:
        # transformers 5 holds a MoE block's experts as one 3-D parameter per projection
        fused = sorted({n for n, _ in model.named_parameters() if n.rsplit(".", 1)[-1] in unknown})
        note = (
            f"; {fused[0]} ... are parameters of fused experts, not linear layers, which "
            "target_modules cannot adapt"
            if fused
            else ""
        )
        raise SystemExit(
            f"{who}: lora target_modules/modules_to_save {unknown} name no module of "
            f"{base_model} ({type(model).__name__}); its linear layers are "
            f"{linear_names(model)} (or '{ALL_LINEAR}'){note}"
        )


def lora_config(lora: dict):
    """PEFT's LoraConfig for an arm's `lora` settings."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        # PEFT takes all-linear as a string only
        target_modules=ALL_LINEAR
        if lora["target_modules"] == [ALL_LINEAR]
        else lora["target_modules"],
        modules_to_save=lora.get("modules_to_save") or None,
        task_type="CAUSAL_LM",
    )


def attention_kernels() -> None:
    """Training's attention runs on SDPA's flash kernel (causal_logits passes no mask), or the
    memory-efficient one, never cuDNN's. On Hopper PyTorch 2.11 ranks cuDNN first, and cuDNN
    plans each new shape on the host: 1.3 s of a SmolLM2 LoRA job's first step on the H200,
    in a lineage whose trainings are 1-6 steps long (docs/benchmark-log.md)."""
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)


def unwrapped(model):
    """The transformers model inside a PEFT wrapper (the model itself when it has none)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def zero3_leaf_classes(model, hyper: dict) -> list[str]:
    """The module classes ZeRO-3 treats as one unit: all their parameters gathered on entry,
    one set of hooks, instead of hooks on every submodule. 'auto' is the model's own
    transformer block (`_no_split_modules`, what FSDP wraps); [] hooks every submodule.
    PEFT turns each adapted Linear into five modules, and per-module hooks kept the GPU idle
    most of a LoRA step (BENCHMARKS.md). DPO and SimPO qualify too: both sides of a pair go
    through one forward pass (objective.preference_sum)."""
    setting = hyper["zero3_leaf_modules"]
    if setting == "auto":
        return sorted(getattr(unwrapped(model), "_no_split_modules", None) or [])
    return list(setting or [])


def mark_zero3_leaves(model, hyper: dict, where: str) -> list[str]:
    from deepspeed.utils import set_z3_leaf_modules

    leaf = zero3_leaf_classes(model, hyper)
    if not leaf:
        return leaf
    try:
        set_z3_leaf_modules(model, leaf)
    except ValueError:
        raise SystemExit(
            f"zero3_leaf_modules {leaf}: no module of {where} has such a class"
        ) from None
    # DeepSpeed 0.19 loses track of a leaf whose input needs no gradient (layer 0 under LoRA,
    # the embeddings being frozen) and meets a released LoRA weight in the backward pass;
    # an embedding output that requires grad costs layer 0's input gradient only.
    model.enable_input_require_grads()
    return leaf


def optimizer(model, hyper: dict, fused: bool | None) -> torch.optim.AdamW:
    """AdamW over the trainable parameters in named groups (param_groups)."""
    return torch.optim.AdamW(param_groups(model, hyper), fused=fused)


def param_groups(model, hyper: dict) -> list[dict]:
    """Named AdamW groups: 'lora' (or 'all' for full FT) at lr, 'modules_to_save' at lm_head_lr."""
    head, rest = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (head if "modules_to_save" in name else rest).append(p)
    groups = [
        {
            "name": "all" if hyper["method"] == "full" else "lora",
            "params": rest,
            "lr": hyper["lr"],
            "weight_decay": hyper["weight_decay"],
        }
    ]
    if head:
        groups.append(
            {
                "name": "modules_to_save",
                "params": head,
                "lr": hyper.get("lm_head_lr") or hyper["lr"],
                "weight_decay": hyper["weight_decay"],
            }
        )
    return groups


def adapter_plan(model) -> list | None:
    """The adapter file's entries, each key with the parameter it holds, matched once at set-up:
    PEFT's own selection (get_peft_model_state_dict over the parameters themselves). None for
    full weights, or where an entry is not a parameter as it stands: the save then goes through
    PEFT's save_pretrained."""
    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict

    if not isinstance(model, PeftModel):
        return None
    if model.peft_config[model.active_adapter].task_type is None:
        return None  # PEFT would write the base's class beside it (auto_mapping)
    entries = get_peft_model_state_dict(model, state_dict=model.state_dict(keep_vars=True))
    if not all(isinstance(p, torch.nn.Parameter) for p in entries.values()):
        return None
    return list(entries.items())


def save_adapter(model, plan: list, out_dir: Path) -> None:
    """PEFT's save_pretrained of a LoRA adapter: the same two files, byte for byte but for the
    config's sets, written sorted (tests/unit/test_adapter_save.py), without PEFT's walks of
    the whole model, its clone of every tensor that shares a buffer (all of them under
    ZeRO-1/2) and its model card, which cost most of PEFT's save, the GPU idle through it
    (benchmarks/adapter_save.py)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    # ZeRO-1/2 keep each weight as a view of one flat buffer: views that do not overlap save
    # as they are (safetensors copies each to the host). One tensor under two keys (a resized
    # embedding in modules_to_save: PEFT saves it as the layer and as its trained copy) is
    # refused by safetensors, so the second is a copy, as PEFT's save_pretrained makes it.
    weights, seen = {}, set()
    for key, p in plan:
        t = p.detach()
        where = (t.data_ptr(), t.numel())
        weights[key] = t.clone() if where in seen else t
        seen.add(where)
    save_file(weights, str(out_dir / models.ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = copy.copy(model.peft_config[model.active_adapter])
    config.inference_mode = True  # as PEFT writes it: a saved adapter loads for inference
    # PEFT writes a set (target_modules) in its iteration order, which string hashing changes
    # from process to process: the same training would write another adapter_config.json
    for key, value in list(vars(config).items()):
        if isinstance(value, set):
            setattr(config, key, sorted(value))
    if config.base_model_name_or_path is None:  # as PEFT fills it in
        config.base_model_name_or_path = unwrapped(model).__dict__.get("name_or_path") or None
    config.save_pretrained(str(out_dir))


def save_weights(model, plan: list | None, out_dir: Path) -> None:
    if plan is None:
        model.save_pretrained(str(out_dir), safe_serialization=True)
    else:
        save_adapter(model, plan, out_dir)


def save(engine, model, out_dir: Path, rank: int, hyper: dict, stage: int, plan=None) -> None:
    """Gather ZeRO-3 shards, then save on rank 0 (an adapter by `plan`, adapter_plan's, when
    given). Saving without the gather writes shape-(0,) tensors
    (docs/notes.md#zero-3-save-gathers-first). Below stage 3 every rank holds every weight whole
    (ZeRO 1/2 partition only optimizer state and gradients)."""
    import deepspeed

    if stage < 3:
        if rank == 0:
            save_weights(model, plan, out_dir)
        return
    if hyper["method"] == "full":
        # Gathers one layer at a time onto rank 0, never the whole model on every rank.
        state = engine._zero3_consolidated_16bit_state_dict()
        if rank == 0:
            model.save_pretrained(str(out_dir), state_dict=state, safe_serialization=True)
        return
    trainable = [p for p in model.parameters() if p.requires_grad]
    with deepspeed.zero.GatheredParameters(trainable, modifier_rank=None):
        if rank == 0:
            save_weights(model, plan, out_dir)
