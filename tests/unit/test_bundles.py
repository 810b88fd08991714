"""Bundle checks: the B3 template defect, renderer equality, diff."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from arenaflow import chat, manifest
from arenaflow.bases import tinymodel
from arenaflow.bundles import build as bundles
from arenaflow.bundles import checks
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


def test_chatml_template_matches_renderer_on_every_conversation():
    tok = tinymodel.build_tokenizer()
    tok.chat_template = chat.CHATML_TEMPLATE
    res = check_template_matches(tok)
    n = len(checks.SHAPES)
    assert res["verdict"] == "PASS" and f"{2 * n} renders of {n} conversations" in res["detail"]


def test_the_conversations_have_the_shapes_real_pools_produce():
    convs = checks.SHAPES.values()
    roles = [[m["role"] for m in c] for c in convs]
    assert any(len(c) >= 8 for c in convs)
    assert any(a == b for r in roles for a, b in zip(r, r[1:]))  # a role twice in a row
    assert any("system" in r[1:] for r in roles)  # a system turn not in first place
    assert any("\r\n" in m["content"] for c in convs for m in c)
    assert any("\r" in m["content"].replace("\r\n", "") for c in convs for m in c)  # a lone CR
    assert any("tool" in r and r.index("tool") < len(r) - 1 for r in roles)  # a tool turn inside


# The templates shipped: arenaflow's, and the embedded bases' own (models/*/chat_template.jinja)
SHIPPED = {
    "chatml": chat.CHATML_TEMPLATE,
    **{
        d.name: (d / "chat_template.jinja").read_text(encoding="utf-8")
        for d in sorted((Path(__file__).parents[2] / "models").iterdir())
        if (d / "chat_template.jinja").exists()
    },
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_the_shipped_templates_are_accepted(name):
    assert len(SHIPPED) >= 3
    assert check_template_compiles(SHIPPED[name])["verdict"] == "PASS"
    tok = tinymodel.build_tokenizer()
    tok.chat_template = SHIPPED[name]
    assert check_template_matches(tok)["verdict"] == "PASS"


def test_b3s_template_is_refused_only_for_its_known_defects():
    """tests/e2e/b3_chat_template.jinja (lineage 000's B3) does not compile; its expression form
    renders every conversation as arenaflow does and is refused only for raising on an unknown
    role (docs/lineages.md#000-the-b3-to-b3f-template-fix)."""
    b3 = (Path(__file__).parents[1] / "e2e/b3_chat_template.jinja").read_text(encoding="utf-8")
    with pytest.raises(BundleCheckError, match="unknown tag 'raise_exception'"):
        check_template_compiles(b3)
    tok = tinymodel.build_tokenizer()
    tok.chat_template = b3.replace(
        "{%- raise_exception('messages must be defined') -%}",
        "{{- raise_exception('messages must be defined') -}}",
    )
    for msgs in checks.SHAPES.values():
        for gen in (False, True):
            rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert rendered == chat.render(msgs, add_generation_prompt=gen)
    with pytest.raises(BundleCheckError, match="template raises on unknown role"):
        check_template_matches(tok)


def _chatml_with(loop: str = "messages", content: str = "content", keep: str = "true") -> str:
    """arenaflow's template with its loop, its content expression or a turn filter changed."""
    return (
        f"{{%- for message in {loop} -%}}"
        "{%- set content = message['content'] if message['content'] is not none else '' -%}"
        f"{{%- if {keep} -%}}"
        f"{{{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ {content} ~ '<|im_end|>\\n' -}}}}"
        "{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )


# Merges consecutive turns of one role into one turn, as some bases' templates do.
MERGES = (
    "{%- set ns = namespace(role=none, text='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == ns.role -%}"
    "{%- set ns.text = ns.text ~ '\\n' ~ message['content'] -%}"
    "{%- else -%}"
    "{%- if ns.role is not none -%}"
    "{{- '<|im_start|>' ~ ns.role ~ '\\n' ~ ns.text ~ '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- set ns.role = message['role'] -%}{%- set ns.text = message['content'] -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if ns.role is not none -%}"
    "{{- '<|im_start|>' ~ ns.role ~ '\\n' ~ ns.text ~ '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# (template, the conversation it is refused on, the message where the first difference falls,
# the messages it loses or rewrites)
BROKEN = {
    "keeps the last 4 messages": (
        _chatml_with(loop="messages[-4:]"),
        "ten messages",
        "message 0 \\(system\\)",
        "0 \\(system\\), 1 \\(user\\), 2 \\(assistant\\), 3 \\(user\\), "
        "4 \\(assistant\\), 5 \\(user\\)$",
    ),
    "merges repeated roles": (
        MERGES,
        "repeated roles",
        "message 0 \\(user\\)",
        None,
    ),
    "drops a system message not first": (
        _chatml_with(keep="message['role'] != 'system' or loop.first"),
        "system not first",
        "message 2 \\(system\\)",
        "2 \\(system\\)$",
    ),
    "strips \\r": (
        _chatml_with(content="content | replace('\\r', '')"),
        "CRLF",
        "message 0 \\(system\\)",
        "0 \\(system\\), 1 \\(user\\), 2 \\(assistant\\), 3 \\(user\\)$",
    ),
    "escapes content as HTML": (
        _chatml_with(content="content | e"),
        "tool role",
        "message 2 \\(tool\\)",
        "2 \\(tool\\)$",
    ),
}


@pytest.mark.parametrize("broken", sorted(BROKEN))
def test_a_template_that_loses_or_rewrites_messages_is_refused_naming_the_conversation(broken):
    template, conversation, where, lost = BROKEN[broken]
    assert check_template_compiles(template)["verdict"] == "PASS"
    tok = tinymodel.build_tokenizer()
    tok.chat_template = template
    with pytest.raises(BundleCheckError) as e:
        check_template_matches(tok)
    msg = str(e.value)
    assert msg.startswith(
        f"template renders {conversation!r} (add_generation_prompt=False) differently from "
        "arenaflow.chat.render: first difference at character "
    ), msg
    assert re.search(f"character \\d+, in {where}: served '", msg), msg
    if lost:
        assert re.search(f"messages lost or rewritten: {lost}", msg), msg
    else:  # merged: every content is still there, in order
        assert "lost" not in msg
    # the first difference is the first character where the two renderings part
    msgs = checks.SHAPES[conversation]
    got = tok.apply_chat_template(msgs, tokenize=False)
    want = chat.render(msgs)
    at = int(re.search(r"character (\d+)", msg).group(1))
    assert got[:at] == want[:at] and got[at : at + 1] != want[at : at + 1]


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
    "template, message",
    [*BAD_TEMPLATES, (B3_TEMPLATE, ".*raise_exception")],
    ids=["trim", "open last turn", "raises", "B3 does not compile"],
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
