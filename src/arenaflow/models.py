"""Loading the base model, a policy (base + an arm's adapter) and the base's identity."""

from __future__ import annotations

from pathlib import Path

import torch

from arenaflow import manifest

# The files of a PEFT LoRA adapter (what PeftModel.from_pretrained reads)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_WEIGHTS, ADAPTER_CONFIG)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def dtype_for(dev: torch.device) -> torch.dtype:
    # CPUs here have no native bf16: batched CPU generation and training stay in float32.
    return torch.bfloat16 if dev.type == "cuda" else torch.float32


def is_adapter(path: str | Path) -> bool:
    """Whether a run's directory holds a LoRA adapter (else full weights)."""
    return (Path(path) / ADAPTER_CONFIG).exists()


def load_tokenizer(path: str | Path, chat_template: str | None = None):
    """The tokenizer in `path`; with `chat_template` (base.chat_template: own, chatml or a
    .jinja file), carrying that template, which arenaflow.chat.format_of then renders."""
    from transformers import AutoTokenizer

    from arenaflow import chat

    tok = AutoTokenizer.from_pretrained(str(path))
    if chat_template is not None:
        chat.apply_template(tok, chat_template, path)
    return tok


def fit_embeddings(model, tokenizer):
    """Resize the model's embeddings to a tokenizer that chat.apply_template gave tokens (ChatML
    on a base without them), the new rows the mean of the old ones (transformers'
    mean_resizing), so they start as an average token rather than noise."""
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    return model


def pad_id(tokenizer) -> int:
    """The id that fills padded positions: the tokenizer's pad token, else its EOS.

    No padded position reaches a real token's output or a loss (masked out, or after every real
    token under the causal mask), so which real token fills it does not matter; many bases ship
    no pad token (Llama 3, some GGUF imports), and the tokenizer is never given one, so a bundle's
    tokenizer reloads as the user's."""
    for i in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if i is not None:
            return i
    raise ValueError(
        f"tokenizer {tokenizer.name_or_path or type(tokenizer).__name__}: "
        "no pad token and no EOS token to pad with; set one in its tokenizer_config.json"
    )


def from_pretrained(path: str | Path, **kwargs):
    """AutoModelForCausalLM.from_pretrained without the Hugging Face Hub's kernels.

    transformers 5.25 requires the `kernels` package and turns it on by default: on load, and on
    every train()/eval() after, it swaps the forward of hub-decorated layers (RMSNorm, ...) for a
    kernel it fetches from the Hub, or else for the class's own forward. That fetches code at run
    time (none of the GPU hosts here reach the Hub), and the swap undoes arenaflow's own norm and
    SwiGLU forwards (arenaflow.fused) whenever a mode changes: a DPO reference taken in eval mode
    then ran other kernels than the policy's first step (tests/unit/test_models.py). Off, the
    model runs the code of its transformers release, as up to 5.24 by default."""
    from transformers import AutoModelForCausalLM

    from arenaflow import bases

    if Path(path).is_dir() and (why := bases.not_a_model(path)):
        raise ValueError(why)  # before transformers, which would look for it on the Hub
    return AutoModelForCausalLM.from_pretrained(str(path), use_kernels=False, **kwargs)


def partial_rotary(model) -> str | None:
    """Why `model`'s rotary embedding turns only part of each attention head (None: it turns all
    of it): a partial_rotary_factor or rotary_pct below 1 (GPT-NeoX/Pythia, Phi-4-mini, Bamba),
    or a rotary table narrower than the heads. arenaflow's own rotary code (the training step's
    and the packed Llama decode step's) rotates whole heads; such a model keeps its own code."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    kind = f"{type(model).__name__} (model_type {getattr(cfg, 'model_type', None)!r})"
    rope = getattr(cfg, "rope_parameters", None) or {}
    places = [vars(cfg) if hasattr(cfg, "__dict__") else {}, rope]
    places += [v for v in rope.values() if isinstance(v, dict)]  # per layer type
    for key in ("partial_rotary_factor", "rotary_pct"):
        for place in places:
            v = place.get(key)
            if isinstance(v, (int, float)) and v < 1:
                return f"{kind} rotates a part of each head ({key} {v:g})"
    heads = getattr(cfg, "num_attention_heads", None)
    head = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)
    for name, m in model.named_modules():
        inv = getattr(m, "inv_freq", None)
        if head and isinstance(inv, torch.Tensor) and 2 * inv.numel() != head:
            return f"{kind} rotates {2 * inv.numel()} of each head's {head} dimensions ({name})"
    return None


def load_base(path: str | Path, dev: torch.device | None = None):
    dev = dev or device()
    return from_pretrained(path, dtype=dtype_for(dev)).to(dev)


def load_policy(
    base_path: str | Path,
    adapter_dir: str | Path | None,
    merge: bool = True,
    consumer: str = "loading a policy",
    job: str | None = None,
    chat_template: str | None = None,
):
    """(model, tokenizer) for sampling: the base, plus the arm's adapter when given (or the
    arm's full weights, when its directory holds a full fine-tune).

    The arm's directory must verify against its manifest first (ManifestError names the file
    and `consumer`): here, so that no caller can load an arm it has not verified.
    The adapter is merged into a private copy of the weights for speed; the files on disk are
    untouched. With `job`, its start-up phases are marked (arenaflow.jobclock). The tokenizer
    carries `chat_template` (load_tokenizer)."""
    from arenaflow import jobclock

    def mark(phase: str) -> None:
        if job is not None:
            jobclock.mark(job, phase)

    import transformers  # noqa: F401  (marked apart from loading)

    mark("imports")
    if adapter_dir is not None:
        manifest.require(adapter_dir, consumer)
        mark("verify")
    if adapter_dir is not None and not is_adapter(adapter_dir):
        # a full fine-tune: the arm's directory holds the whole model
        model = load_base(adapter_dir)
        model.eval()
        mark("model")
        return model, load_tokenizer(base_path, chat_template)
    tokenizer = load_tokenizer(base_path, chat_template)
    model = fit_embeddings(load_base(base_path), tokenizer)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
        if merge:
            model = model.merge_and_unload()
    model.eval()
    mark("model")
    return model, tokenizer


def base_revision(path: str | Path, configured: str | None = None) -> str:
    """The configured revision, else sha256 over the weight files (name-sorted)."""
    if configured:
        return configured
    weights = sorted(Path(path).glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{path}: no *.safetensors weight files to identify the base by")
    return manifest.sha256_text("".join(f"{w.name}\t{manifest.sha256_file(w)}\n" for w in weights))
