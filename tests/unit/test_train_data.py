"""Batching and packing: deterministic global batches, exact splits, packing that loses nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arenaflow.train import data

HYPER = {"micro_batch_size": 2, "grad_accum": 3, "epochs": 2, "seed": 1}


def rows(lengths):
    return [(np.arange(n) + 10 * i, np.ones(n, dtype=np.int8)) for i, n in enumerate(lengths)]


def test_global_batches_are_a_seeded_permutation_per_epoch_and_ranks_partition_them():
    steps = list(data.global_batches(25, HYPER, world=2))
    # 25 = 2 full steps of 2*3*2 rows + 1 row, too few for a step of 6 micro-batches: 2 steps of
    # 13 and 12 rows x 2 epochs
    assert [s for s, _ in steps] == list(range(1, 5))
    assert [len(g) for _, g in steps] == [13, 12, 13, 12]
    again = list(data.global_batches(25, HYPER, world=2))
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(steps, again))
    glob = steps[1][1]
    shares = [np.concatenate(data.micro_batches(glob, HYPER, 2, r)) for r in (0, 1)]
    assert sorted(np.concatenate(shares).tolist()) == sorted(glob.tolist())
    assert all(len(m) == 2 for r in (0, 1) for m in data.micro_batches(glob, HYPER, 2, r))


def test_length_bucketing_keeps_each_steps_rows_and_removes_the_padding_of_mixed_lengths():
    rs = rows([10, 100] * 12)  # one global batch of 8 = 4 short + 4 long rows, on average
    hyper = {**HYPER, "micro_batch_size": 4, "grad_accum": 2, "epochs": 1, "seq_len": 512}
    lengths = data.row_lengths(rs, hyper["seq_len"])
    for _, glob in data.global_batches(len(rs), hyper, world=1):
        plain = data.micro_batches(glob, hyper, 1, 0)
        bucketed = data.micro_batches(glob, hyper, 1, 0, lengths)
        assert sorted(np.concatenate(bucketed).tolist()) == sorted(np.concatenate(plain).tolist())
        # sorted, a micro-batch's longest row is at most the next one's shortest
        assert max(lengths[bucketed[0]]) <= min(lengths[bucketed[1]])
    # the oracle: count pad tokens by hand for the bucketed split of every step
    pad = sum(
        int(lengths[m].max()) * len(m) - int(lengths[m].sum())
        for _, g in data.global_batches(len(rs), hyper, 1)
        for m in data.micro_batches(g, hyper, 1, 0, lengths)
    )
    total = sum(
        int(lengths[m].max()) * len(m)
        for _, g in data.global_batches(len(rs), hyper, 1)
        for m in data.micro_batches(g, hyper, 1, 0, lengths)
    )
    assert data.padding_fraction(rs, hyper, 1, bucketing=True) == pytest.approx(pad / total)
    assert data.padding_fraction(rs, hyper, 1, bucketing=True) < data.padding_fraction(
        rs, hyper, 1, bucketing=False
    )


@pytest.mark.parametrize(
    "n_rows,world,sizes",
    [
        (984, 1, [492, 492]),  # run 19's rft_r3 at 512 rows a step: two steps, not 512 + 472
        (533, 1, [267, 266]),  # run 22's rft_r1: not 512 + 21
        (512, 1, [512]),
        (100, 1, [100]),  # fewer rows than one global batch: one step of all of them
        (1025, 1, [342, 342, 341]),  # one rank, one micro-batch: 1 row more makes a step more
        (1025, 2, [513, 512]),  # 1 row, fewer than grad_accum x world = 2: no step of its own
        (1027, 2, [343, 342, 342]),  # 3 rows >= 2: a step more
    ],
)
def test_an_epoch_trains_every_row_once_in_steps_of_near_equal_size(n_rows, world, sizes):
    hyper = {"micro_batch_size": 512 // world, "grad_accum": 1, "epochs": 2, "seed": 3}
    steps = list(data.global_batches(n_rows, hyper, world))
    assert [len(g) for _, g in steps] == sizes * 2
    assert data.total_steps(n_rows, hyper, world) == len(steps)
    for epoch in (steps[: len(sizes)], steps[len(sizes) :]):
        assert sorted(np.concatenate([g for _, g in epoch]).tolist()) == list(range(n_rows))
    # every micro-batch of every rank gets a row
    for _, g in steps:
        assert all(len(m) for r in range(world) for m in data.micro_batches(g, hyper, world, r))


def test_too_small_a_corpus_is_refused_with_the_numbers():
    with pytest.raises(SystemExit, match="corpus has 5 rows, fewer than one per micro-batch"):
        data.total_steps(5, HYPER, world=2)


def test_packing_keeps_every_token_in_order_within_seq_len():
    rs = rows([5, 7, 3, 9, 2, 8])
    packed = data.pack(rs, seq_len=12)
    assert all(len(ids) <= 12 for ids, _ in packed)
    assert np.array_equal(
        np.concatenate([p[0] for p in packed]), np.concatenate([r[0] for r in rs])
    )
    assert [len(p[0]) for p in packed] == [12, 12, 10]  # 5+7 | 3+9 | 2+8, in order


@pytest.mark.parametrize(
    "n_rows,micro,accum,world",
    [(984, 512, 1, 1), (100, 512, 1, 1), (1025, 256, 1, 2), (1027, 4, 3, 2), (25, 2, 3, 2)],
)
@pytest.mark.parametrize("pairs", [False, True])
def test_the_largest_micro_batch_is_the_largest_that_collate_makes(
    n_rows, micro, accum, world, pairs
):
    """What the CUDA warm-up runs at (train/cuda_warmup.py), against every micro-batch of every
    rank and step collated: its rows, and its padded width; a pairs micro-batch stacks both
    sides (objective.stack_sides), the longer side setting the width."""
    hyper = {"micro_batch_size": micro, "grad_accum": accum, "epochs": 1, "seed": 5}
    hyper |= {"seq_len": 64, "packing": False}
    gen = np.random.default_rng(0)
    sides = ("chosen", "rejected") if pairs else ("sft",)
    corpus = {s: rows(gen.integers(3, 90, n_rows)) for s in sides}
    collated = [
        [data.collate(corpus[s], m, hyper["seq_len"], 0)["input_ids"].shape for s in sides]
        for _, g in data.global_batches(n_rows, hyper, world)
        for r in range(world)
        for m in data.micro_batches(g, hyper, world, r)
    ]
    oracle = (
        max(sum(sh[0] for sh in c) for c in collated),
        max(sh[1] for c in collated for sh in c),
    )
    assert data.largest_micro_batch(corpus, hyper, world) == oracle
    assert data.largest_micro_batch(corpus, {**hyper, "packing": True}, world) is None


@pytest.mark.parametrize("pad_id", [0, 7])
def test_collate_places_every_token_as_a_row_by_row_fill_does(pad_id):
    """Against the obvious row-by-row fill: rows cut at seq_len, right padding with pad_id, the
    attention mask from each row's length and labels from its loss mask. pad_id 7 is also a real,
    supervised token of the rows (a base without a pad token pads with EOS): it stays a label."""
    gen = np.random.default_rng(3)
    rows = [
        (gen.integers(0, 9, n), gen.integers(0, 2, n).astype(np.int8)) for n in (5, 1, 12, 9, 30, 4)
    ]
    idx, seq_len = [4, 0, 2, 1, 5], 10
    got = data.collate(rows, idx, seq_len, pad_id)
    width = max(min(len(rows[i][0]), seq_len) for i in idx)
    for name, fill in (("input_ids", pad_id), ("attention_mask", 0), ("labels", -100)):
        want = torch.full((len(idx), width), fill, dtype=torch.long)
        for r, i in enumerate(idx):
            x, m = rows[i][0][:seq_len], rows[i][1][:seq_len]
            for p, (tok, sup) in enumerate(zip(x, m)):
                want[r, p] = {
                    "input_ids": tok,
                    "attention_mask": 1,
                    "labels": tok if sup else -100,
                }[name]
        assert got[name].dtype == torch.long and torch.equal(got[name], want), name
    assert (got["labels"] == 7).any() and got["input_ids"].shape == (5, 10)  # not vacuous
