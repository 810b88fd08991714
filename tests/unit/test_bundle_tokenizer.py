"""The tokenizer a bundle ships (bundles.save_tokenizer): the base's own, with arenaflow's chat
template in both files servers read it from, whatever the base's own template does."""

from __future__ import annotations

from pathlib import Path

import pytest

from arenaflow import chat, io, models
from arenaflow.bundles import build as bundles
from arenaflow.bundles.checks import BundleCheckError, check_template_matches

BASE = Path(__file__).resolve().parents[2] / "models/tiny-arith"
# A base template as Llama 3's and SmolLM2's differ from ChatML: a default system prompt when
# there is none, content trimmed, no newline after a turn's end.
NATIVE = (
    "{% if messages[0]['role'] != 'system' %}"
    "<|im_start|>system\nYou are a bot.<|im_end|>{% endif %}"
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + (m['content'] or '') | trim + '<|im_end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture
def native_base(tmp_path, strip_pad):
    base = strip_pad(BASE, tmp_path / "native")
    (base / "chat_template.jinja").unlink()
    (base / "chat_template.jinja").write_text(NATIVE, encoding="utf-8")
    return base


def test_a_base_with_its_own_template_gets_a_bundle_template_that_passes_the_checks(
    native_base, tmp_path
):
    own = models.load_tokenizer(native_base)
    assert own.chat_template == NATIVE
    with pytest.raises(BundleCheckError, match="differently from arenaflow.chat.render"):
        check_template_matches(own)
    out = tmp_path / "bundle"
    out.mkdir()
    bundles.save_tokenizer(str(native_base), chat.CHATML_TEMPLATE, out)
    reloaded = models.load_tokenizer(out)
    assert check_template_matches(reloaded)["verdict"] == "PASS"
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == chat.CHATML_TEMPLATE
    assert io.read_json(out / "tokenizer_config.json")["chat_template"] == chat.CHATML_TEMPLATE
    # otherwise the base's tokenizer as it was: no pad token added, the same ids
    assert reloaded.pad_token is None and reloaded.eos_token_id == own.eos_token_id
    text = chat.render([{"role": "user", "content": "Größe 🙂"}], add_generation_prompt=True)
    assert reloaded(text)["input_ids"] == own(text)["input_ids"]
