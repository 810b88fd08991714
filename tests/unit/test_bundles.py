"""Bundle checks: the B3 template defect, renderer equality, diff."""

from __future__ import annotations

import json

import pytest

from arenaflow import bundles, chat, tinymodel

# seeds/000: B3 used raise_exception as a statement on line 2 and as an expression later.
B3_TEMPLATE = (
    "{%- if not messages is defined -%}\n"
    "    {%- raise_exception('messages must be defined') -%}\n"
    "{%- endif -%}\n"
    "{%- for message in messages -%}\n"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}\n"
    "{{- raise_exception('unknown role') -}}\n"
    "{%- endif -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
)


def test_b3_template_fails_to_compile_with_jinjas_unknown_tag_error():
    with pytest.raises(bundles.BundleCheckError, match="Encountered unknown tag 'raise_exception'"):
        bundles.check_template_compiles(B3_TEMPLATE)


def test_b3_template_with_expression_form_compiles():
    fixed = B3_TEMPLATE.replace("{%- raise_exception('messages must be defined') -%}",
                                "{{- raise_exception('messages must be defined') -}}")
    assert bundles.check_template_compiles(fixed)["verdict"] == "PASS"


def test_chatml_template_matches_renderer_on_all_six_shapes():
    tok = tinymodel.build_tokenizer()
    tok.chat_template = chat.CHATML_TEMPLATE
    res = bundles.check_template_matches(tok)
    assert res["verdict"] == "PASS" and "12 renders" in res["detail"]


def test_a_template_that_drops_the_trailing_newline_is_caught():
    tok = tinymodel.build_tokenizer()
    tok.chat_template = chat.CHATML_TEMPLATE.replace("'<|im_end|>\\n'", "'<|im_end|>'")
    with pytest.raises(bundles.BundleCheckError, match="differently from arenaflow.chat.render"):
        bundles.check_template_matches(tok)


def test_a_template_that_raises_on_unknown_roles_fails_degradation():
    fixed = B3_TEMPLATE.replace("{%- raise_exception('messages must be defined') -%}", "")
    tok = tinymodel.build_tokenizer()
    tok.chat_template = fixed
    with pytest.raises(bundles.BundleCheckError, match="raises on unknown role"):
        bundles.check_template_matches(tok)


def test_diff_names_differing_files_and_weight_identity(tmp_path):
    a, b = tmp_path / "B3", tmp_path / "B3f"
    for d in (a, b):
        d.mkdir()
        (d / "adapter_model.safetensors").write_bytes(b"same weights")
        (d / "serving_config.json").write_text(json.dumps({"x": 1}))
    (a / "chat_template.jinja").write_text("old")
    (b / "chat_template.jinja").write_text("new")
    differ, same = bundles.diff(a, b)
    assert differ == ["chat_template.jinja"] and same
    (b / "adapter_model.safetensors").write_bytes(b"other weights")
    differ, same = bundles.diff(a, b)
    assert "adapter_model.safetensors" in differ and not same
