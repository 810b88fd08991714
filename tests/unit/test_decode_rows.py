"""The static decode loop's shared prompt pass and shrinking batch (arenaflow.decode.rows).

A prompt's k samples share its prompt pass, and rows that stopped leave the batch: greedy output
stays generate()'s (rows stopping at different steps, left padding, through both steps), samples
stay draws from transformers' warpers and depend only on the seed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from devices import CPU_AND_CUDA
from scipy import stats
from test_decode import VOCAB, left_padded, random_llama, until_stop

from arenaflow.decode import rows, sampling
from arenaflow.decode import static as decode

K = 2
NEW = 24  # new tokens a row


def _prompts(device: str):
    """Eight ragged prompts, each repeated K times (prompt-major)."""
    rng = np.random.default_rng(7)
    distinct = [rng.integers(3, VOCAB, n).tolist() for n in (5, 17, 9, 30, 1, 12, 4, 21)]
    return distinct, left_padded([r for r in distinct for _ in range(K)], 0, device)


def _staggered_stops(model, distinct, device) -> list[int]:
    """Stop tokens taken from the prompts' own greedy continuations, chosen (a seeded search)
    so that most rows stop before the first check (SYNC_EVERY steps) and some run past the
    second."""
    ids, mask = left_padded(distinct, 0, device)
    free = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0
    )[:, ids.shape[1] :].tolist()
    early = sorted({t for r in free for t in r[: decode.SYNC_EVERY]})
    rng = np.random.default_rng(0)
    for _ in range(2000):
        stops = set(rng.choice(early, 4, replace=False).tolist())
        lengths = [len(until_stop(r, stops)) for r in free]
        early_rows = sum(n <= decode.SYNC_EVERY for n in lengths)
        if early_rows > len(free) // 2 and max(lengths) > 2 * decode.SYNC_EVERY:
            return sorted(stops)
    raise AssertionError("no stop tokens that stop rows at different steps")


@pytest.mark.parametrize("device", CPU_AND_CUDA)
@pytest.mark.parametrize("step", ["llama", "hf"])
def test_shared_prompt_pass_and_shrink_keep_generate_s_greedy_tokens(device, step):
    model = random_llama(device)
    distinct, (ids, mask) = _prompts(device)
    stops = _staggered_stops(model, distinct, device)
    want = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW,
        eos_token_id=stops,
        pad_token_id=0,
        do_sample=False,
    )[:, ids.shape[1] :].tolist()
    want = [until_stop(r, stops) for r in want]
    dec = sampling.Decoding(temperature=0.0, max_new_tokens=NEW)
    d = decode.StaticDecoder(model, *ids.shape, NEW, dec, stops, 0, step=step, share=K)
    assert [until_stop(r, stops) for r in d.run(ids, mask)] == want
    assert len({len(r) for r in want}) >= 4  # rows stopped at several steps
    assert d.last_decode["shrinks"] and d.last_decode["shrinks"][0][1] < ids.shape[0]
    again = d.run(ids, mask)  # the narrowed views and graphs reused
    assert [until_stop(r, stops) for r in again] == want


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_samples_depend_only_on_the_seed_with_sharing_and_shrink(device):
    """The same seed gives the same rows through a fresh decoder and a reused one, another seed
    other rows; without shrinking (sharing only) the draws are the ones unshared rows make."""
    model = random_llama(device)
    distinct, (ids, mask) = _prompts(device)
    stops = list(range(3, 40))  # ~10 % of the tokens: rows stop at many different steps
    dec = sampling.Decoding(temperature=1.0, top_p=0.95, max_new_tokens=NEW)

    def run(seed, **kw):
        d = decode.StaticDecoder(model, *ids.shape, NEW, dec, stops, 0, **kw)
        torch.manual_seed(seed)
        return d.run(ids, mask), d

    first, d = run(3, share=K)
    assert d.last_decode["shrinks"]
    torch.manual_seed(3)
    assert d.run(ids, mask) == first  # reused: its narrowed views and (CUDA) graphs
    assert run(4, share=K)[0] != first
    assert run(3, share=K, shrink=False)[0] == run(3, shrink=False)[0]


@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_tokens_after_a_shrink_are_uniform_draws_on_a_flat_model(device):
    """With a zero output layer every token is uniform: the tokens that the rows still decoding
    draw after the batch shrank (their noise, state and cache moved) follow it (chi-square)."""
    model = random_llama(device, zero_head=True)
    dec = sampling.Decoding(temperature=1.0, max_new_tokens=40)
    stops = list(range(1, 40))  # a row stops with p ~ 0.1 a step: ~43 % live at the check
    n = 256
    ids = torch.full((n, 4), 7, device=device)
    torch.manual_seed(0)
    d = decode.StaticDecoder(model, n, 4, 40, dec, stops, 0, share=n)
    out = d.run(ids, torch.ones_like(ids))
    first = d.last_decode["shrinks"][0][0]
    after = [t for r in out for t in until_stop(r, stops)[first:]]
    assert len(after) > 3 * VOCAB
    assert stats.chisquare(np.bincount(after, minlength=VOCAB)).pvalue > 1e-3


def test_shrunk_size_walks_the_ladder_and_distinct_prompts_refuses_mixed_runs():
    assert rows.shrunk_size(33, 64, 64) == 64  # over SHRINK_AT: no copy
    assert rows.shrunk_size(10, 64, 64) == 16
    assert rows.shrunk_size(1, 16, 64) == rows.MIN_ROWS
    assert rows.shrunk_size(3, 6, 6) == 3
    ids = torch.tensor([[1, 2], [1, 2], [3, 4], [3, 5]])
    with pytest.raises(ValueError, match="share=2: the rows of a run of 2 are not one prompt"):
        rows.distinct_prompts(ids, torch.ones_like(ids), 2)
    with pytest.raises(ValueError, match="share=3: 4 rows are not whole runs of 3"):
        rows.distinct_prompts(ids, torch.ones_like(ids), 3)
