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
