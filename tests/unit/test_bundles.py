"""Bundle checks: the B3 template defect, renderer equality, diff."""

from __future__ import annotations

import json
import re

import pytest

from arenaflow import chat, manifest
from arenaflow.bases import tinymodel
from arenaflow.bundles import build as bundles
from arenaflow.bundles.checks import (
    BundleCheckError,
    check_template_compiles,
    check_template_matches,
)
from arenaflow.bundles.sources import verify_sources

# docs/lineages.md#000-the-b3-to-b3f-template-fix: B3 used raise_exception as a statement on
# line 2 and as an expression later.
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
    with pytest.raises(BundleCheckError, match="Encountered unknown tag 'raise_exception'"):
        check_template_compiles(B3_TEMPLATE)


def test_b3_template_with_expression_form_compiles():
    fixed = B3_TEMPLATE.replace(
        "{%- raise_exception('messages must be defined') -%}",
        "{{- raise_exception('messages must be defined') -}}",
    )
    assert check_template_compiles(fixed)["verdict"] == "PASS"


def test_chatml_template_matches_renderer_on_all_eight_shapes():
    tok = tinymodel.build_tokenizer()
    tok.chat_template = chat.CHATML_TEMPLATE
    res = check_template_matches(tok)
    assert res["verdict"] == "PASS" and "16 renders" in res["detail"]


# Each of these once passed both template checks (or escaped them as a raw Jinja error)
# Trims content: training never does, so content with surrounding whitespace renders apart.
TRIMS = chat.CHATML_TEMPLATE.replace("~ content ~", "~ content | trim ~")
# Leaves a final assistant turn open (as for continuing it): training rows end on one, closed.
OPEN_LAST = chat.CHATML_TEMPLATE.replace(
    "~ content ~ '<|im_end|>\\n' -}}",
    "~ content -}}{%- if not (loop.last and message['role'] == 'assistant') -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}",
)
# Raises at render time, not at compile time.
NO_TOOLS = chat.CHATML_TEMPLATE.replace(
    "{%- for message in messages -%}",
    "{%- for message in messages -%}{%- if message['role'] == 'tool' -%}"
    "{{- raise_exception('tool turns are not supported') -}}{%- endif -%}",
)
BAD_TEMPLATES = [
    (
        TRIMS,
        "template renders 'surrounding whitespace' \\(add_generation_prompt=False\\) differently",
    ),
    (
        OPEN_LAST,
        "template renders 'ends on assistant' \\(add_generation_prompt=False\\) differently",
    ),
    (
        NO_TOOLS,
        "template raises on 'tool role' \\(add_generation_prompt=False\\): "
        "TemplateError: tool turns are not supported",
    ),
]


@pytest.mark.parametrize(
    "template, message", BAD_TEMPLATES, ids=["trim", "open last turn", "raises"]
)
def test_a_template_that_renders_apart_or_raises_fails_the_check(template, message):
    assert template != chat.CHATML_TEMPLATE
    assert check_template_compiles(template)["verdict"] == "PASS"
    tok = tinymodel.build_tokenizer()
    tok.chat_template = template
    with pytest.raises(BundleCheckError, match=message):
        check_template_matches(tok)


@pytest.mark.parametrize(
    "template, message", BAD_TEMPLATES, ids=["trim", "open last turn", "raises"]
)
def test_a_failed_template_check_writes_no_bundle(tmp_path, repo_root, capsys, template, message):
    run = tmp_path / "runs/A/final"
    run.mkdir(parents=True)
    (run / "adapter_config.json").write_text("{}")
    (run / "adapter_model.safetensors").write_bytes(b"weights")
    (run / "training_evidence.json").write_text(
        json.dumps({"corpus": "c", "init": "base", "base_model": "tiny", "base_revision": "r"})
    )
    manifest.write(run)
    corpus = tmp_path / "corpora/c"  # verified before the checks, as every source is
    corpus.mkdir(parents=True)
    (corpus / "stats.json").write_text("{}")
    manifest.write(corpus)
    (tmp_path / "t.jinja").write_text(template)
    cfg = {
        "chat_template": str(tmp_path / "t.jinja"),
        "system_prompt": "S",
        "reload_prompts": ["1+1?"],
        "serving": {
            "do_sample": False,
            "temperature": 0.0,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
            "max_new_tokens": 8,
        },
    }
    with pytest.raises(SystemExit) as e:
        bundles.main(
            [
                "build",
                "--bundle",
                "X",
                "--arm",
                "A",
                "--lineage-json",
                '{"A": []}',
                "--runs",
                str(tmp_path / "runs"),
                "--corpora",
                str(tmp_path / "corpora"),
                "--base-model",
                str(repo_root / "models/tiny-arith"),
                "--bundle-json",
                json.dumps(cfg),
                "--out",
                str(tmp_path / "bundles/X"),
            ]
        )
    assert e.value.code == 1
    assert re.search("check failed, no bundle written: " + message, capsys.readouterr().err)
    assert list((tmp_path / "bundles").iterdir()) == []  # neither the bundle nor its temporary


def test_a_template_that_drops_the_trailing_newline_is_caught():
    tok = tinymodel.build_tokenizer()
    tok.chat_template = chat.CHATML_TEMPLATE.replace("'<|im_end|>\\n'", "'<|im_end|>'")
    with pytest.raises(BundleCheckError, match="differently from arenaflow.chat.render"):
        check_template_matches(tok)


def test_a_template_that_raises_on_unknown_roles_fails_degradation():
    fixed = B3_TEMPLATE.replace("{%- raise_exception('messages must be defined') -%}", "")
    tok = tinymodel.build_tokenizer()
    tok.chat_template = fixed
    with pytest.raises(BundleCheckError, match="raises on unknown role"):
        check_template_matches(tok)


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


def test_a_nominee_in_the_lineage_is_verified_without_a_corpus_of_its_own(tmp_path):
    """Lineage 002's R3 starts from {nominee: dpo}: runs/dpo-nominee/final holds the copied
    arm's weights and nominee.json, no training evidence; its corpus is the copied arm's,
    verified with that arm."""
    import argparse

    from arenaflow import io

    runs, corpora = tmp_path / "runs", tmp_path / "corpora"
    files = {
        "S2": {"training_evidence.json": {"corpus": "sft_e1"}},
        "dpo-nominee": {"nominee.json": {"arm": "S2"}},  # weights beside it, no evidence
    }
    for arm, written in files.items():
        d = runs / arm / "final"
        d.mkdir(parents=True)
        for name, data in written.items():
            io.write_json(d / name, data)
        manifest.write(d)
    (corpora / "sft_e1").mkdir(parents=True)
    io.write_json(corpora / "sft_e1" / "stats.json", {"rows": 1})
    manifest.write(corpora / "sft_e1")
    args = argparse.Namespace(bundle="B6", runs=str(runs), corpora=str(corpora), compare=[])
    verify_sources(args, "dpo-nominee", ["S2"])  # no error
    (corpora / "sft_e1" / "stats.json").write_text('{"rows": 2}')  # the real arm's corpus is
    with pytest.raises(Exception, match="sft_e1"):  # still verified
        verify_sources(args, "dpo-nominee", ["S2"])
