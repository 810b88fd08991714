"""Readout pairing and the comparison's refusal to pair different items."""

from __future__ import annotations

import pandas as pd
import pytest

from arenaflow import evals


def frame(correct, prompts=None, cats=None):
    n = len(correct)
    return pd.DataFrame({
        "item_id": [f"i{j}" for j in range(n)], "replicate": 0,
        "category": cats or ["a"] * n,
        "prompt_sha256": prompts or [f"p{j}" for j in range(n)],
        "target_sha256": [f"t{j}" for j in range(n)], "correct": correct,
    })


def test_compare_counts_wins_losses_and_splits_by_category():
    cand = frame([1, 1, 0, 1, 0, 1], cats=["x", "x", "x", "y", "y", "y"])
    ref = frame([0, 1, 1, 0, 0, 1], cats=["x", "x", "x", "y", "y", "y"])
    res = evals.compare(cand, ref, "t")
    assert (res["wins"], res["losses"], res["ties_pass"], res["ties_fail"]) == (2, 1, 2, 1)
    assert res["delta"] == pytest.approx(100 * (4 - 3) / 6)
    assert res["by_category"]["x"]["wins"] == 1 and res["by_category"]["x"]["losses"] == 1
    assert res["by_category"]["y"]["wins"] == 1 and res["by_category"]["y"]["losses"] == 0


def test_compare_refuses_items_with_different_prompts():
    cand = frame([1, 0])
    ref = frame([1, 0], prompts=["p0", "other"])
    with pytest.raises(ValueError, match="'i1' has a different prompt"):
        evals.compare(cand, ref, "t")


def test_compare_refuses_items_read_out_on_one_side_only():
    with pytest.raises(ValueError, match="one side only"):
        evals.compare(frame([1, 0, 1]), frame([1, 0]), "t")
