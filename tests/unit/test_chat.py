"""arenaflow.chat: the ChatML renderer, its Jinja template and the assistant-only loss mask."""

from __future__ import annotations

import jinja2
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from arenaflow import chat

CONVERSATIONS = {
    "system+user": [
        {"role": "system", "content": "You are a careful math tutor."},
        {"role": "user", "content": "What is 2 + 3?"},
    ],
    "multi-turn": [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ],
    "user-only": [{"role": "user", "content": "Ann has 3 apples."}],
    "embedded-newlines": [
        {"role": "user", "content": "line one\nline two\n\n"},
        {"role": "assistant", "content": "\nstep 1\nstep 2\n"},
    ],
    "non-ascii": [
        {"role": "user", "content": "Zoë a 3 pommes — combien? 日本語 🎉"},
        {"role": "assistant", "content": "Réponse: 3 ✓"},
    ],
    "tool-role": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "calling"},
        {"role": "tool", "content": '{"temp": 21}'},
    ],
    "none-content": [{"role": "user", "content": None}, {"role": "assistant", "content": "ok"}],
    "unknown-role": [{"role": "narrator", "content": "Once upon a time"}],
    "jinja-looking-content": [{"role": "user", "content": "{{ 1 + 1 }} {% if x %}"}],
}


# --- render against hand-written strings --------------------------------------------------


def test_render_system_user_by_hand():
    msgs = CONVERSATIONS["system+user"]
    assert chat.render(msgs) == (
        "<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
    )
    assert chat.render(msgs, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_render_multi_turn_by_hand():
    assert chat.render(CONVERSATIONS["multi-turn"]) == (
        "<|im_start|>system\nS<|im_end|>\n"
        "<|im_start|>user\nq1<|im_end|>\n"
        "<|im_start|>assistant\na1<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n"
        "<|im_start|>assistant\na2<|im_end|>\n"
    )


def test_render_none_content_as_empty_and_unknown_role_as_given():
    assert chat.render([{"role": "user", "content": None}]) == "<|im_start|>user\n<|im_end|>\n"
    assert (
        chat.render([{"role": "narrator", "content": "x"}]) == "<|im_start|>narrator\nx<|im_end|>\n"
    )


def test_render_of_nothing_is_empty_or_just_the_generation_prompt():
    assert chat.render([]) == ""
    assert chat.render([], add_generation_prompt=True) == "<|im_start|>assistant\n"


def test_prompt_messages_omits_an_empty_system_prompt():
    assert chat.prompt_messages(None, "q") == [{"role": "user", "content": "q"}]
    assert chat.prompt_messages("", "q") == [{"role": "user", "content": "q"}]
    assert chat.prompt_messages("S", "q") == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q"},
    ]


# --- the shipped Jinja template is byte-identical to render -------------------------------


@pytest.mark.parametrize("gen", [False, True], ids=["no-gen", "gen"])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_template_via_transformers_matches_render(name, gen):
    msgs = CONVERSATIONS[name]
    rendered, _ = render_jinja_template(
        [msgs], chat_template=chat.CHATML_TEMPLATE, add_generation_prompt=gen
    )
    assert rendered[0] == chat.render(msgs, add_generation_prompt=gen)


@pytest.mark.parametrize("gen", [False, True], ids=["no-gen", "gen"])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_template_in_a_bare_jinja_environment_matches_render(name, gen):
    # no HF globals such as raise_exception, default whitespace handling: any loader must agree
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    msgs = CONVERSATIONS[name]
    out = env.from_string(chat.CHATML_TEMPLATE).render(messages=msgs, add_generation_prompt=gen)
    assert out == chat.render(msgs, add_generation_prompt=gen)


@pytest.mark.parametrize("gen", [False, True], ids=["no-gen", "gen"])
def test_tokenizer_apply_chat_template_matches_render(tokenizer, gen):
    msgs = CONVERSATIONS["multi-turn"]
    out = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
    assert out == chat.render(msgs, add_generation_prompt=gen)


# --- encode_with_mask ---------------------------------------------------------------------


def masked_text(tokenizer, ids, mask) -> str:
    return tokenizer.decode([i for i, m in zip(ids, mask) if m])


def test_mask_covers_only_assistant_content_and_its_im_end(tokenizer):
    msgs = chat.prompt_messages("S", "What is 2 + 3?") + [
        {"role": "assistant", "content": "2 + 3 = 5. The answer is 5."}
    ]
    ids, mask = chat.encode_with_mask(tokenizer, msgs)
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    assert tokenizer.decode(ids) == chat.render(msgs)
    assert masked_text(tokenizer, ids, mask) == "2 + 3 = 5. The answer is 5.<|im_end|>"
    # the supervised span is one contiguous run ending on <|im_end|>; the final "\n" is not in it
    first, last = mask.index(1), len(mask) - 1 - mask[::-1].index(1)
    assert all(mask[first : last + 1])
    assert ids[last] == tokenizer.convert_tokens_to_ids(chat.IM_END)
    assert mask[-1] == 0 and tokenizer.decode(ids[-1:]) == "\n"
    # the "assistant\n" header before the content is not supervised
    assert tokenizer.decode(ids[:first]).endswith("<|im_start|>assistant\n")


def test_mask_covers_every_assistant_turn_and_no_other(tokenizer):
    msgs = CONVERSATIONS["multi-turn"]
    ids, mask = chat.encode_with_mask(tokenizer, msgs)
    assert masked_text(tokenizer, ids, mask) == "a1<|im_end|>a2<|im_end|>"
    unmasked = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
    assert "q1" in unmasked and "q2" in unmasked and "a1" not in unmasked


def test_mask_with_multibyte_assistant_content(tokenizer):
    msgs = [{"role": "user", "content": "é?"}, {"role": "assistant", "content": "Réponse 日本 🎉"}]
    ids, mask = chat.encode_with_mask(tokenizer, msgs)
    assert masked_text(tokenizer, ids, mask) == "Réponse 日本 🎉<|im_end|>"


def test_empty_or_none_assistant_content_supervises_only_im_end(tokenizer):
    for content in ("", None):
        msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": content}]
        ids, mask = chat.encode_with_mask(tokenizer, msgs)
        assert masked_text(tokenizer, ids, mask) == "<|im_end|>"
        assert sum(mask) == 1


def test_no_assistant_turn_means_nothing_supervised(tokenizer):
    ids, mask = chat.encode_with_mask(tokenizer, CONVERSATIONS["system+user"])
    assert len(ids) > 0 and sum(mask) == 0


def test_mask_matches_render_with_unknown_roles(tokenizer):
    msgs = [
        {"role": "narrator", "content": "x"},
        {"role": "assistant", "content": "y"},
        {"role": "tool", "content": "z"},
    ]
    ids, mask = chat.encode_with_mask(tokenizer, msgs)
    assert tokenizer.decode(ids) == chat.render(msgs)
    assert masked_text(tokenizer, ids, mask) == "y<|im_end|>"


def test_batched_masks_across_batch_boundaries_cover_exactly_each_assistant_turn(tokenizer):
    convs = [
        [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": f"Réponse {i} 日本" * (i % 3)},
        ]
        for i in range(10)
    ] + [CONVERSATIONS["multi-turn"], CONVERSATIONS["system+user"]]
    got = list(chat.encode_many_with_mask(tokenizer, convs, batch_size=3))
    assert len(got) == len(convs)
    for msgs, (ids, mask) in zip(convs, got):
        assert tokenizer.decode(ids) == chat.render(msgs)
        want = "".join(f"{m['content'] or ''}<|im_end|>" for m in msgs if m["role"] == "assistant")
        assert masked_text(tokenizer, ids, mask) == want


def test_a_multi_turn_row_renders_its_context_and_trains_on_every_assistant_turn(tokenizer):
    from arenaflow.corpora import build as corpora

    row = {
        "prompt": "q2",
        "context": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}],
        "completion": "a2",
    }
    msgs = chat.row_messages("S", row)
    assert chat.render(msgs, True) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n"
        "<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert chat.row_messages("", {"prompt": "q"}) == [{"role": "user", "content": "q"}]
    arrays, _ = corpora.tokenize([row], tokenizer, "S")
    ids, mask = arrays["input_ids"], arrays["loss_mask"]
    assert masked_text(tokenizer, ids, mask) == "a1<|im_end|>a2<|im_end|>"
