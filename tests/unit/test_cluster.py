"""arenaflow.evals.cluster: the clustered SE of a paired difference against statsmodels'
cluster-robust OLS, its reduction to the item-level SE, and its place in a comparison."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats as sps

from arenaflow.evals import cluster
from arenaflow.evals import compare as comparisons


def families(seed: int = 7, groups: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """Paired 0/1 differences in clusters of 1..9 items that share a cluster effect."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 10, groups)
    labels = np.repeat([f"fam{g}" for g in range(groups)], sizes)
    lean = np.repeat(rng.normal(0.1, 0.35, groups), sizes)  # a family's shared lean
    u = rng.random(len(labels))
    diff = np.where(u < 0.25 + lean / 2, 1.0, np.where(u > 0.75 + lean / 2, -1.0, 0.0))
    return diff, labels


def test_clustered_se_ci_and_p_are_statsmodels_cluster_robust_ols():
    diff, labels = families()
    fit = sm.OLS(diff * 100, np.ones(len(diff))).fit(
        cov_type="cluster", cov_kwds={"groups": pd.factorize(labels)[0]}, use_t=True
    )
    got = cluster.paired_clustered(diff, labels, "family")
    assert got["n_clusters"] == 24 and got["cluster_by"] == "family"
    assert got["clustered"]["se"] == pytest.approx(fit.bse[0], rel=1e-12)
    assert got["clustered"]["ci95"] == pytest.approx(list(fit.conf_int()[0]), rel=1e-10)
    assert got["clustered"]["p_value"] == pytest.approx(fit.pvalues[0], rel=1e-10)
    assert got["clustered"]["df"] == 23 == fit.df_resid_inference
    assert got["design_effect"] > 1  # shared leans: the items overstate the information


def test_singleton_clusters_give_exactly_the_item_level_se_and_t():
    diff, _ = families(seed=3)
    got = cluster.paired_clustered(diff, np.arange(len(diff)))
    tt = sps.ttest_1samp(diff * 100, 0.0)
    assert got["clustered"]["se"] == pytest.approx(got["items"]["se"], rel=1e-12)
    assert got["items"]["se"] == pytest.approx(np.std(diff * 100, ddof=1) / np.sqrt(len(diff)))
    assert got["clustered"]["t"] == pytest.approx(tt.statistic, rel=1e-12)
    assert got["clustered"]["p_value"] == pytest.approx(tt.pvalue, rel=1e-10)
    assert got["design_effect"] == pytest.approx(1.0)


def test_one_cluster_or_no_variation_leaves_the_clustered_test_undefined():
    one = cluster.paired_clustered([1, 0, -1, 1], ["a"] * 4)
    assert one["clustered"]["se"] is None and one["clustered"]["p_value"] is None
    flat = cluster.paired_clustered([0, 0, 0, 0], ["a", "a", "b", "b"])
    assert flat["clustered"]["t"] is None and flat["design_effect"] is None
    with pytest.raises(ValueError, match="3 differences but 2 cluster labels"):
        cluster.clustered_se([1, 0, 1], ["a", "b"])


def test_the_default_cluster_of_a_pool_row():
    assert cluster.cluster_of_row({"id": "q1", "category": "add"}) == "item:q1"
    assert cluster.cluster_of_row({"id": "i1", "category": "case", "constraints": []}) == (
        "family:case"
    )
    assert cluster.cluster_of_row({"id": "x", "cluster": "passage-9"}) == "passage-9"


def rows(arm: str, correct: list[int], clusters: list[str] | None, replicate: int = 0):
    df = pd.DataFrame(
        {
            "arm": arm,
            "item_id": [f"q{i}" for i in range(len(correct))],
            "replicate": replicate,
            "category": "add",
            "prompt_sha256": [f"p{i}" for i in range(len(correct))],
            "target_sha256": [f"t{i}" for i in range(len(correct))],
            "correct": [bool(c) for c in correct],
        }
    )
    if clusters is not None:
        df["cluster"] = clusters
    return df


def test_a_comparison_reports_the_clustered_se_beside_the_item_level_one():
    cand = [1, 1, 1, 1, 0, 0, 1, 0]
    ref = [0, 0, 0, 1, 0, 1, 1, 0]
    fams = ["a", "a", "a", "b", "b", "c", "c", "d"]
    out = comparisons.compare(rows("B", cand, fams), rows("R", ref, fams), "t")
    c = out["clustered"]
    assert c["cluster_by"] != cluster.ITEM and c["n_clusters"] == 4 and c["n"] == 8
    diff = np.array(cand) - np.array(ref)
    assert c["delta"] == pytest.approx(out["delta"])
    assert c["clustered"]["se"] == pytest.approx(cluster.clustered_se(diff * 100, fams))


def test_without_a_cluster_column_an_items_replicates_are_one_cluster():
    cand = pd.concat([rows("B", [1, 0, 1], None, r) for r in (0, 1)])
    ref = pd.concat([rows("R", [0, 0, 1], None, r) for r in (0, 1)])
    c = comparisons.compare(cand, ref, "t")["clustered"]
    assert c["cluster_by"] == cluster.ITEM and c["n"] == 6 and c["n_clusters"] == 3
