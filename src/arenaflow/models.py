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


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


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

    return AutoModelForCausalLM.from_pretrained(str(path), use_kernels=False, **kwargs)


def load_base(path: str | Path, dev: torch.device | None = None):
    dev = dev or device()
    return from_pretrained(path, dtype=dtype_for(dev)).to(dev)


def load_policy(
    base_path: str | Path,
    adapter_dir: str | Path | None,
    merge: bool = True,
    consumer: str = "loading a policy",
    job: str | None = None,
):
    """(model, tokenizer) for sampling: the base, plus the arm's adapter when given (or the
    arm's full weights, when its directory holds a full fine-tune).

    The arm's directory must verify against its manifest first (ManifestError names the file
    and `consumer`): here, so that no caller can load an arm it has not verified.
    The adapter is merged into a private copy of the weights for speed; the files on disk are
    untouched. With `job`, its start-up phases are marked (arenaflow.jobclock)."""
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
        return model, load_tokenizer(base_path)
    model = load_base(base_path)
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
        if merge:
            model = model.merge_and_unload()
    model.eval()
    mark("model")
    return model, load_tokenizer(base_path)


def base_revision(path: str | Path, configured: str | None = None) -> str:
    """The configured revision, else sha256 over the weight files (name-sorted)."""
    if configured:
        return configured
    weights = sorted(Path(path).glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{path}: no *.safetensors weight files to identify the base by")
    return manifest.sha256_text("".join(f"{w.name}\t{manifest.sha256_file(w)}\n" for w in weights))
