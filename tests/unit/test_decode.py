"""The static decode loop (arenaflow.decode.static, sampling's engine="static").

Its greedy output is held to transformers' generate(), its sampler to transformers' own logits
warpers (an independent implementation) by a chi-square test, and its random stream to "each
step draws fresh noise". The same tests run on CUDA, where each step is a replayed CUDA graph,
when a GPU is present (marker gpu: `python -m pytest -m gpu tests/unit/test_decode.py`).
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
from devices import CPU_AND_CUDA
from scipy import stats
from transformers import GenerationMixin, LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from arenaflow import chat, models
from arenaflow.bases import tinymodel
from arenaflow.decode import sampling
from arenaflow.decode import static as decode
from arenaflow.decode import steps as decode_steps

BASE = Path(__file__).resolve().parents[2] / "models/tiny-arith"
VOCAB = 384
DEVICES = CPU_AND_CUDA


def random_llama(device: str, zero_head: bool = False) -> LlamaForCausalLM:
    """Two layers with grouped-query attention (4 heads over 2 KV heads), float32 weights."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    model = LlamaForCausalLM(cfg).to(device).eval()
    if zero_head:  # every next token uniform over the vocabulary
        model.lm_head.weight.data.zero_()
    return model


def left_padded(rows: list[list[int]], pad: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    return ids, mask


def until_stop(row: list[int], stops: list[int]) -> list[int]:
    cut = next((i for i, t in enumerate(row) if t in stops), None)
    return row if cut is None else row[: cut + 1]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_equals_transformers_generate_on_ragged_prompts(device, penalty):
    if penalty != 1.0 and "prompt_ignore_length" not in inspect.getsource(
        GenerationMixin._get_logits_processor
    ):
        pytest.skip(
            "this transformers' generate() penalises left padding as seen tokens (5.24's does not)"
        )
    model = random_llama(device)
    rng = np.random.default_rng(1)
    rows = [rng.integers(3, VOCAB, n).tolist() for n in (5, 17, 9, 30, 1, 12)]
    ids, mask = left_padded(rows, 0, device)
    stops = [1, 2]
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=40, repetition_penalty=penalty)
    want = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=40,
        eos_token_id=stops,
        pad_token_id=0,
        **dec.generate_kwargs(),
    )[:, ids.shape[1] :].tolist()
    got = decode.StaticDecoder(model, *ids.shape, 40, dec, stops, 0).run(ids, mask)
    assert [until_stop(r, stops) for r in got] == [until_stop(r, stops) for r in want]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("share", [1, 20_000])
def test_samples_follow_the_temperature_and_top_p_distribution(device, share):
    """20,000 first tokens of one prompt against the probabilities that transformers' own
    temperature and top-p warpers give (chi-square, tokens expected < 5 times pooled); the
    prompt's pass run per row, or once for all (share)."""
    model = random_llama(device)
    dec = sampling.Decoding(temperature=0.7, top_p=0.8, max_new_tokens=1)
    prompt = torch.tensor([[5, 77, 130, 9, 250]], device=device)
    with torch.no_grad():
        logits = model(prompt).logits[:, -1].float()
    warped = TopPLogitsWarper(0.8)(prompt, TemperatureLogitsWarper(0.7)(prompt, logits))
    expected = warped.softmax(-1)[0].double().cpu().numpy()
    expected /= expected.sum()
    n = 20_000  # enough to tell temperature 0.7 from 0.65 (p ~ 1e-9) on this flat model
    torch.manual_seed(3)
    draws = decode.StaticDecoder(model, n, 5, 1, dec, [-1], 0, share=share).run(
        prompt.repeat(n, 1), torch.ones(n, 5, device=device)
    )
    counts = np.bincount([r[0] for r in draws], minlength=VOCAB)
    assert counts[expected == 0].sum() == 0  # nothing outside the nucleus
    big = expected * n >= 5
    pooled = expected[~big].sum() > 0
    obs = np.r_[counts[big], [counts[~big].sum()] * int(pooled)]
    exp = np.r_[expected[big], [expected[~big].sum()] * int(pooled)] * n
    assert big.sum() >= 5  # a real test: several tokens in play
    assert stats.chisquare(obs, exp).pvalue > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_each_step_draws_fresh_noise(device):
    """With a zero output layer every token is uniform: a step that replayed the previous
    step's noise would repeat its token. Repeats must be as rare as 1 in VOCAB."""
    model = random_llama(device, zero_head=True)
    dec = sampling.Decoding(temperature=1.0, max_new_tokens=33)
    torch.manual_seed(0)
    ids = torch.full((64, 4), 7, device=device)
    out = np.array(
        decode.StaticDecoder(model, 64, 4, 33, dec, [-1], 0).run(ids, torch.ones_like(ids))
    )
    assert out.shape == (64, 33)
    repeats = (out[:, 1:] == out[:, :-1]).mean()
    assert repeats < 5 / VOCAB, repeats
    assert stats.chisquare(np.bincount(out[:, 1:].ravel(), minlength=VOCAB)).pvalue > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_a_decoder_reused_across_batches_gives_the_same_rows_as_a_fresh_one(device):
    model = random_llama(device)
    dec = sampling.Decoding(temperature=1.0, max_new_tokens=20)
    ids, mask = left_padded([[9, 8, 7], [100, 101, 102], [5, 6, 44], [1, 2, 3]], 0, device)
    reused = decode.StaticDecoder(model, *ids.shape, 20, dec, [2], 0)
    torch.manual_seed(1)
    reused.run(ids.flip(0), mask)  # another batch first: leaves its cache rows and buffers behind
    torch.manual_seed(5)
    again = reused.run(ids, mask)
    torch.manual_seed(5)
    fresh = decode.StaticDecoder(model, *ids.shape, 20, dec, [2], 0).run(ids, mask)
    assert again == fresh


@pytest.mark.parametrize("device", DEVICES)
def test_one_decoder_serves_every_decoding_as_fresh_decoders_do(device):
    """decoder_for keeps one decoder per shape, whatever the decoding (a readout's greedy and
    served regimes): greedy, sampled, penalised and greedy again through it give the rows a
    fresh decoder of each gives. On CUDA its forward's graphs are captured once, and a graph
    of the token choice per decoding."""
    model = random_llama(device)
    ids, mask = left_padded([[9, 8, 7, 6], [100, 101], [5, 6, 44], [1, 2, 3, 4]], 0, device)
    decodings = [
        sampling.Decoding(temperature=0.0, max_new_tokens=40),
        sampling.Decoding(temperature=0.7, top_p=0.95, max_new_tokens=40),
        sampling.Decoding(temperature=0.0, max_new_tokens=40, repetition_penalty=1.3),
        sampling.Decoding(temperature=0.0, max_new_tokens=40),
    ]
    decoders, got, want = [], [], []
    for i, dec in enumerate(decodings):
        decoders.append(decode.decoder_for(model, *ids.shape, 40, dec, [2], 0))
        torch.manual_seed(i)
        got.append(decoders[-1].run(ids, mask))
        torch.manual_seed(i)
        want.append(decode.StaticDecoder(model, *ids.shape, 40, dec, [2], 0).run(ids, mask))
    assert all(d is decoders[0] for d in decoders)
    assert got == want
    assert got[0] == got[3] != got[2]  # the penalty applied, and not left behind
    assert got[1] != got[0]
    if device == "cuda":  # buckets of 32 and 44 cache rows; greedy, sampled, penalised
        assert (len(decoders[0].graphs), len(decoders[0].choosers)) == (2, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_a_bucket_is_captured_when_a_batch_first_reaches_it(device):
    """A batch whose rows all stop at once runs SYNC_EVERY steps: only their bucket is captured.
    A later batch through the same decoder that runs on captures the rest on the way, and
    decodes as a decoder without graphs does. Through transformers' modelling step, which
    "auto" takes on CUDA (on CPU the same loop, buckets and stop checks, nothing captured)."""
    model = random_llama(device)
    ids, mask = left_padded([[9, 8, 7, 6], [100, 101], [5, 6, 44], [1, 2, 3, 4]], 0, device)
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=60)
    every = list(range(model.config.vocab_size))
    stopping = decode.StaticDecoder(model, *ids.shape, 60, dec, every, 0, step="hf")
    stopping.run(ids, mask)
    assert stopping.last_decode["steps"] == decode.SYNC_EVERY
    assert stopping._bucket(0) == 32
    graphed = decode.StaticDecoder(model, *ids.shape, 60, dec, [-1], 0, step="hf")  # no stops
    eager = decode.StaticDecoder(model, *ids.shape, 60, dec, [-1], 0, graphs=False, step="hf")
    first = graphed.run(ids, mask)
    assert graphed.last_decode["steps"] == 59
    assert {graphed._bucket(i) for i in range(59)} == {32, 64}
    assert first == graphed.run(ids, mask) == eager.run(ids, mask)
    assert len(first) == 4 and all(len(r) == 60 for r in first)  # no row stopped early
    captured = {"cuda": ({32}, {32, 64}), "cpu": (set(), set())}[device]
    assert (set(stopping.graphs), set(graphed.graphs)) == captured


@pytest.fixture(scope="module")
def policy():
    return models.load_policy(BASE, None)


def test_static_engine_gives_generate_s_greedy_texts_on_the_embedded_model(policy):
    model, tok = policy
    prompts = [
        chat.render(chat.prompt_messages(tinymodel.SYSTEM_PROMPT, q), True)
        for q in (
            "Ann has 23 apples and gets 15 more. How many apples now?",
            "What is 7 times 8?",
            "Cal had 81 coins and gave away 27. How many coins are left?",
            "Half of 90?",
        )
    ]
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=48)
    hf = sampling.generate(model, tok, prompts, dec, batch_size=3)
    static = sampling.generate(model, tok, prompts, dec, batch_size=3, engine="static")
    assert static == hf
    assert any(s["stopped"] for (s,) in static)  # stop detection is exercised


def test_static_engine_samples_are_seeded(policy):
    model, tok = policy
    prompt = [
        chat.render(chat.prompt_messages(tinymodel.SYSTEM_PROMPT, "What is 7 times 8?"), True)
    ]
    dec = sampling.Decoding(temperature=1.0, max_new_tokens=16)
    a, b, c = (
        sampling.generate(model, tok, prompt, dec, k=8, seed=s, engine="static") for s in (4, 4, 5)
    )
    assert a == b and a != c
    assert len({s["text"] for s in a[0]}) > 1


def test_unknown_engine_and_wrong_batch_shape_are_refused(policy):
    model, tok = policy
    with pytest.raises(ValueError, match="engine 'sglang': expected 'hf', 'static' or 'vllm'"):
        sampling.generate(model, tok, ["x"], sampling.Decoding(), engine="sglang")
    decoder = decode.StaticDecoder(model, 2, 8, 4, sampling.Decoding(), [0], 0)
    with pytest.raises(ValueError, match=r"shape \(3, 8\); this decoder was built for \(2, 8\)"):
        decoder.run(torch.zeros(3, 8, dtype=torch.long), torch.ones(3, 8))


def test_compiled_decode_kernels_under_auto_weigh_the_planned_tokens(
    policy, monkeypatch, engine_settings
):
    """Engine fused_decode `auto` (the default): a static-engine call plans prompts x k x new
    tokens, and the compiled kernels are used from AUTO_MIN_TOKENS on; true / false force them."""
    model, tok = policy
    engine_settings(fused_decode="auto")
    monkeypatch.setattr(decode_steps, "_planned_tokens", None)
    prompt = chat.render(chat.prompt_messages(tinymodel.SYSTEM_PROMPT, "Half of 90?"), True)
    dec = sampling.Decoding(max_new_tokens=5)
    sampling.generate(model, tok, [prompt] * 3, dec, k=2, engine="static")
    assert decode_steps._planned_tokens == 3 * 2 * 5 and not decode_steps.fused_kernels_on()
    decode_steps.plan(decode_steps.AUTO_MIN_TOKENS)
    assert decode_steps.fused_kernels_on()
    for setting, planned, on in ((True, 1, True), (False, 10**9, False)):
        engine_settings(fused_decode=setting)
        decode_steps.plan(planned)
        assert decode_steps.fused_kernels_on() is on
