"""Decoded tool-leak audit: tool-call text printed in an answer instead of a call being made.

Lineage 002 audited its decodes for "tool calls printed as text instead of being made" and let
that audit decide whether a DPO anchor shipped (docs/lineages.md#002-sft-dpo-and-if-repair). A
readout has no tools, so any tool-call syntax in an answer is a leak. `leak(text)` names the
first one found, or None:

- a chat template's tool-call marker (MARKERS): <tool_call> (Hermes, Qwen), <|python_tag|> and
  <function=...> (Llama 3.1), [TOOL_CALLS] (Mistral), DeepSeek's and Kimi's call tokens,
  <|call|> (harmony);
- a JSON object (anywhere, fenced or not) shaped like a call: a string "name" with "arguments"
  (an object, or a JSON string as OpenAI sends it), or with "parameters" holding values; also
  the same wrapped as {"function": {...}} or in a list. A *definition*, whose "parameters" is a
  JSON schema ({"type": "object", "properties": ...}), is not a call, and ordinary JSON answers
  ({"name": "Ada", "age": 36}) have neither key;
- `functions.NAME(` or `to=functions.NAME` outside code (harmony's recipient syntax; in a code
  block or `inline code` "functions.append(" is ordinary Python).

A screen, like lineage 002's keyword safety classifier: an answer that *explains* a tool-call
format is flagged too.
"""

from __future__ import annotations

import json
import re

MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "<function=",
    "[TOOL_CALLS]",
    "<|tool_call_begin|>",
    "<|tool_calls_section_begin|>",
    "<\uff5ctool\u2581calls\u2581begin\uff5c>",  # DeepSeek's <｜tool▁calls▁begin｜>
    "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "<|call|>",
)
_CODE = re.compile(r"```.*?(?:```|\Z)|`[^`\n]+`", re.DOTALL)  # fenced blocks, inline code
_RECIPIENT = re.compile(r"(?:\bto=functions\.[A-Za-z_]\w*|(?<![\w.])functions\.[A-Za-z_]\w*\()")
_OPEN = re.compile(r"[\[{]")
_DECODER = json.JSONDecoder()


def _is_schema(value) -> bool:
    return isinstance(value, dict) and ("properties" in value or value.get("type") == "object")


def _is_call(obj) -> bool:
    if isinstance(obj, list):
        return any(_is_call(x) for x in obj)
    if not isinstance(obj, dict):
        return False
    if isinstance(obj.get("function"), dict) and _is_call(obj["function"]):
        return True
    if not isinstance(obj.get("name"), str):
        return False
    args = obj.get("arguments")
    if isinstance(args, dict):
        return True
    if isinstance(args, str):  # OpenAI's arguments are a JSON string
        try:
            return isinstance(json.loads(args), dict)
        except ValueError:
            return False
    params = obj.get("parameters")
    return isinstance(params, dict) and not _is_schema(params)


def _json_values(text: str):
    """Every JSON object or array that parses starting at a { or [ of `text` (outermost first;
    nested ones are inspected through their parent)."""
    i = 0
    while (m := _OPEN.search(text, i)) is not None:
        try:
            value, end = _DECODER.raw_decode(text, m.start())
        except ValueError:
            i = m.start() + 1
            continue
        yield value
        i = end


def leak(text: str) -> str | None:
    """What tool-call text `text` prints, or None: a marker, 'json call' or 'functions.'."""
    for marker in MARKERS:
        if marker in text:
            return marker
    if any(_is_call(v) for v in _json_values(text)):
        return "json call"
    if _RECIPIENT.search(_CODE.sub(" ", text)):
        return "functions."
    return None
