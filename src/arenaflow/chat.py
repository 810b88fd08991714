"""The one chat renderer used for training rows, eval prompts and bundle template checks.

Callers pass the chat format of the base's tokenizer (`format_of`: the template that
base.chat_template chose, arenaflow.chatformat); without one, or with ChatML's, `render` is
arenaflow's ChatML, rendered here in Python. `CHATML_TEMPLATE` is its Jinja template, which must
render byte-identically to it (arenaflow.bundles.build checks that before a bundle exists).
ChatML per turn: `<|im_start|>{role}\\n{content}<|im_end|>\\n`.
"""

from __future__ import annotations

import hashlib
from itertools import chain

import numpy as np

from arenaflow import chatformat

IM_START, IM_END, EOS = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
CONTROL_TOKENS = (IM_START, IM_END, EOS)  # text that would become a turn's markers if rendered

# Only if/for/set and plain expressions: no environment-specific globals such as
# raise_exception, so every Jinja loader compiles it
# (docs/lineages.md#000-the-b3-to-b3f-template-fix).
# An unknown role is rendered as given and None content as empty, never raised.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set content = message['content'] if message['content'] is not none else '' -%}"
    "{{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ content ~ '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def render_turn(role: str, content) -> str:
    return f"{IM_START}{role}\n{'' if content is None else content}{IM_END}\n"


def format_of(tokenizer) -> chatformat.Format | None:
    """The chat format of a tokenizer whose chat_template models.load_tokenizer set; None (the
    ChatML renderer) for ChatML's template or none."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or template == CHATML_TEMPLATE:
        return None
    return chatformat.Format(template, tokenizer)


def apply_template(tokenizer, spec: str, base_dir) -> None:
    """Give the base's tokenizer the template base.chat_template names (chatformat.template_text).
    ChatML on a tokenizer without its markers adds them as special tokens (the model's embeddings
    are resized to match: arenaflow.models.fit_embeddings)."""
    tokenizer.chat_template = chatformat.template_text(spec, base_dir, CHATML_TEMPLATE)
    if tokenizer.chat_template == CHATML_TEMPLATE:
        vocab = tokenizer.get_vocab()
        missing = [t for t in (IM_START, IM_END) if t not in vocab]
        if missing:
            tokenizer.add_special_tokens({"additional_special_tokens": missing})


def markers(tokenizer) -> tuple[str, ...]:
    """The text a pool row must not hold: the special tokens the chat template writes around
    turns (ChatML's control tokens when rendering in ChatML) and the tokenizer's own named ones
    (BOS, EOS, ...), each of which would render as a token of the template, not as text."""
    fmt = format_of(tokenizer)
    written = CONTROL_TOKENS if fmt is None else fmt.written_markers()
    named = [t for t in tokenizer.all_special_tokens if t.strip()]
    return tuple(dict.fromkeys([*written, *named]))


def template_record(tokenizer, spec: str | None) -> dict:
    """The template a job rendered with, as its outputs record it beside its engine settings:
    base.chat_template as passed (None: the tokenizer's as saved) and the sha256 of the
    template's text (ChatML's when the tokenizer has none, as `render` falls back to it)."""
    template = getattr(tokenizer, "chat_template", None)
    text = template if isinstance(template, str) else CHATML_TEMPLATE
    return {"spec": spec, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def render(
    messages: list[dict], add_generation_prompt: bool = False, fmt: chatformat.Format | None = None
) -> str:
    """Render a conversation exactly as training saw it: in `fmt` (format_of), else ChatML."""
    if fmt is not None:
        return fmt.render(messages, add_generation_prompt)
    text = "".join(render_turn(m.get("role"), m.get("content")) for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def prompt_messages(system_prompt: str | None, user: str) -> list[dict]:
    msgs = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return msgs + [{"role": "user", "content": user}]


def row_messages(system_prompt: str | None, row: dict) -> list[dict]:
    """A pool row's conversation up to its prompt: the system turn, the earlier turns a
    multi-turn row carries as `context` (arenaflow.pools.build, kind chat), then the prompt."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return system + list(row.get("context") or []) + [{"role": "user", "content": row["prompt"]}]


def encode_with_mask(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation (in the tokenizer's format, format_of) and a 0/1
    mask that is 1 only on assistant content and its closing end-of-turn token (so the model
    learns to stop), found by character offsets, which holds for any tokenizer that reports
    them."""
    ids, mask = next(encode_many_with_mask(tokenizer, [messages]))
    return ids.tolist(), mask.tolist()


def encode_many_with_mask(tokenizer, conversations: list[list[dict]], batch_size: int = 1024):
    """(int32 ids, int8 mask) arrays of each conversation, as encode_with_mask: one tokenizer
    call per batch and the mask computed over the whole batch's offsets at once. Row by row,
    the corpus stage spent ~40 % of its time building masks in Python (BENCHMARKS.md)."""
    fmt = format_of(tokenizer)
    for start in range(0, len(conversations), batch_size):
        chunk = conversations[start : start + batch_size]
        enc = tokenizer(
            [render(m, fmt=fmt) for m in chunk],
            add_special_tokens=False,
            return_offsets_mapping=True,
        )
        lengths = [len(x) for x in enc["input_ids"]]
        n = sum(lengths)
        ids = np.fromiter(chain.from_iterable(enc["input_ids"]), np.int32, n)
        a, b = (
            np.fromiter(
                chain.from_iterable(chain.from_iterable(enc["offset_mapping"])), np.int64, 2 * n
            )
            .reshape(-1, 2)
            .T
        )
        spans = [assistant_spans(m, fmt) for m in chunk]
        width = max(1, *map(len, spans))
        lo, hi = (
            np.full((len(chunk), width), 1, np.int64),
            np.full((len(chunk), width), 0, np.int64),
        )  # lo > hi: empty
        for i, row in enumerate(spans):
            for j, (s, e) in enumerate(row):
                lo[i, j], hi[i, j] = s, e
        row = np.repeat(np.arange(len(chunk)), lengths)
        inside = ((lo[row] <= a[:, None]) & (b[:, None] <= hi[row])).any(axis=1) & (b > a)
        cuts = np.cumsum(lengths)[:-1]
        yield from zip(np.split(ids, cuts), np.split(inside.astype(np.int8), cuts))


def assistant_spans(
    messages: list[dict], fmt: chatformat.Format | None = None
) -> list[tuple[int, int]]:
    """Character spans of each assistant turn's content and its end-of-turn token (ChatML's
    <|im_end|>) in render(messages, fmt=fmt)."""
    if fmt is not None:
        return fmt.assistant_spans(messages)
    spans, pos = [], 0
    for m in messages:
        turn = render_turn(m.get("role"), m.get("content"))
        if m.get("role") == "assistant":
            start = pos + len(IM_START) + len("assistant\n")
            spans.append((start, pos + len(turn) - 1))  # up to and including <|im_end|>, not "\n"
        pos += len(turn)
    return spans
