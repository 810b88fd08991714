"""A chat format: a Jinja chat template rendered as transformers' apply_chat_template renders it.

The template is chosen by `base.chat_template` (docs/workflow.md#the-chat-template): the base's
own (`own`), arenaflow's ChatML (`chatml`), or a .jinja file. From it come the rendered prompts
and training rows, each assistant turn's span for the loss mask, and the end-of-turn tokens
sampling stops on. Everything is found by rendering the template, never by assuming a format, so
a template that writes `bos_token` itself gets exactly one BOS (rendered text is tokenized
without special tokens, as apply_chat_template tokenizes it).
"""

from __future__ import annotations

import json
from pathlib import Path

OWN, CHATML = "own", "chatml"
# an assistant turn's content while finding what the template writes after one
PROBE = "arenaflow probe answer 7"


class TemplateError(ValueError):
    pass


def own_template(base_dir: str | Path) -> str | None:
    """The chat template a base directory ships (chat_template.jinja, else tokenizer_config.json's
    chat_template), read without loading the tokenizer; None when it has none."""
    base_dir = Path(base_dir)
    if (base_dir / "chat_template.jinja").is_file():
        return (base_dir / "chat_template.jinja").read_text(encoding="utf-8")
    cfg = base_dir / "tokenizer_config.json"
    template = (
        json.loads(cfg.read_text(encoding="utf-8")).get("chat_template") if cfg.is_file() else None
    )
    if isinstance(template, list):  # named templates: transformers uses "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template or None


def template_text(spec: str, base_dir: str | Path, chatml_template: str) -> str:
    """The template `spec` (own | chatml | a .jinja path) names for the base in `base_dir`."""
    if spec == CHATML:
        return chatml_template
    if spec == OWN:
        template = own_template(base_dir)
        if template is None:
            raise TemplateError(
                f"base {base_dir} has no chat template (no chat_template.jinja, no chat_template "
                "in tokenizer_config.json): set base.chat_template to 'chatml' or to a .jinja file"
            )
        return template
    path = Path(spec)
    if not path.is_file():
        raise TemplateError(f"base.chat_template {spec!r}: no such template file")
    return path.read_text(encoding="utf-8")


class _Refused(Exception):
    pass


def _refuse(message):
    raise _Refused(message)


def system_turn_refusal(template: str) -> str | None:
    """The template's own error when it refuses a system turn before a user's (Mistral v0.1
    and Gemma raise_exception on one), None when it takes one. Rendered by jinja2 alone, as
    transformers sets it up, so that a config is checked without loading transformers; an
    error other than the template's raise_exception is left to the jobs that render it."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = _refuse
    tokens = {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": True}
    system = [{"role": "system", "content": "s"}]
    try:
        compiled = env.from_string(template)
        compiled.render(messages=[{"role": "user", "content": "u"}], **tokens)
    except Exception:  # not about a system turn: the jobs' renderer reports it
        return None
    try:
        compiled.render(messages=[*system, {"role": "user", "content": "u"}], **tokens)
    except _Refused as e:
        return str(e)
    except Exception:
        return None
    return None


class Format:
    """A template and the tokenizer it renders for (its special tokens are the template's
    bos_token, eos_token, ... variables, as in apply_chat_template)."""

    def __init__(self, template: str, tokenizer):
        self.template = template
        self.tokenizer = tokenizer
        # the texts that count as a turn's end marker: every special or added token but
        # whitespace ones (Gemma's "\n" tokens are ordinary text to a template)
        names = {*tokenizer.added_tokens_encoder, *tokenizer.all_special_tokens}
        self.markers = tuple(sorted((t for t in names if t.strip()), key=len, reverse=True))

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        # apply_chat_template drops None-valued keys before rendering; so do we
        msgs = [{k: v for k, v in m.items() if v is not None} for m in messages]
        rendered, _ = render_jinja_template(
            conversations=[msgs],
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            **self.tokenizer.special_tokens_map,
        )
        return rendered[0]

    def _marker_after(self, text: str, at: int) -> tuple[int, int] | None:
        """(start, end) of the first end marker in text[at:], or None."""
        hits = [(i, i + len(m)) for m in self.markers if (i := text.find(m, at)) >= 0]
        return min(hits) if hits else None

    def assistant_spans(self, messages: list[dict]) -> list[tuple[int, int]]:
        """Character spans in render(messages) of each assistant turn: from the end of the
        prompt that asks for it (render of the turns before it with the generation prompt)
        through the first end-of-turn marker after its content, so the model learns to stop."""
        full, spans = self.render(messages), []
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            start = len(prompt := self.render(messages[:i], add_generation_prompt=True))
            content = (m.get("content") or "").strip()
            after = full.find(content, start) if full.startswith(prompt) else -1
            if after < 0:
                raise TemplateError(
                    f"chat template: assistant turn {i} does not follow the prompt the template "
                    "renders for the turns before it, so its loss mask cannot be found"
                )
            marker = self._marker_after(full, after + len(content))
            if marker is None:
                raise TemplateError(
                    f"chat template writes no special token after assistant turn {i}'s content: "
                    "a model trained on it could not learn to stop"
                )
            spans.append((start, marker[1]))
        return spans

    def end_of_turn(self) -> list[str]:
        """The special tokens the template writes after a final assistant turn's content (ChatML
        <|im_end|>, Llama 3 <|eot_id|>, Phi-3 <|end|> and its EOS, ...): sampling stops on
        each."""
        msgs = [{"role": "user", "content": "1"}, {"role": "assistant", "content": PROBE}]
        full = self.render(msgs)
        tail, out = full[full.rfind(PROBE) + len(PROBE) :], []
        at = 0
        while (hit := self._marker_after(tail, at)) is not None:
            out.append(tail[hit[0] : hit[1]])
            at = hit[1]
        return out

    def written_markers(self) -> list[str]:
        """The special tokens the template writes around turns (role markers, end of turn, BOS):
        found by rendering a conversation of every role, the system turn apart since some
        templates refuse one."""
        user, answer = {"role": "user", "content": "1"}, {"role": "assistant", "content": PROBE}
        text = self.render([user, answer, user], add_generation_prompt=True)
        try:
            text += self.render([{"role": "system", "content": "s"}, user])
        except Exception:  # a template without a system turn (Gemma, Mistral v0.1)
            pass
        return [m for m in self.markers if m in text]

    def stop_ids(self) -> list[int]:
        ids = self.tokenizer.convert_tokens_to_ids(self.end_of_turn())
        return [i for i in ids if i is not None and i != self.tokenizer.unk_token_id]
