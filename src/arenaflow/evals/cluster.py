"""Cluster-robust standard error of a paired difference, beside the item-level one.

Items that come in families (an instruction-following family, a multi-turn conversation, the K
replicate readouts of one item) are not independent, so the item-level SE understates the
uncertainty (Miller, "Adding Error Bars to Evals", 2024, sec. 2.2). Each readout row carries a
`cluster` (cluster_of_row, written by arenaflow.evals.readout); rows without one are their own
item's cluster, so the K replicates of an item always share one. No command of its own:
arenaflow.evals.compare writes `clustered` into every comparison.

The estimator is the CR1 sandwich of an OLS of the differences on a constant, as statsmodels'
OLS(...).fit(cov_type="cluster") computes it: Var = G/(G-1) * sum_g (sum_{i in g} e_i)^2 / n^2
(e_i = d_i - mean d; the (n-1)/(n-k) factor is 1 for one regressor), inference on t with G - 1
degrees of freedom. With one row per cluster it is exactly the item-level s/sqrt(n) (ddof 1),
the SE of scipy's ttest_1samp.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as sps

ITEM = "item"  # the name of the default clustering (each item, its replicates together)


def cluster_of_row(row: dict) -> str:
    """A pool row's default cluster: its own `cluster` when an import gives one, the constraint
    family of an instruction-following prompt (its category is its first constraint's family),
    else the item itself."""
    if row.get("cluster") is not None:
        return str(row["cluster"])
    if "constraints" in row:
        return f"family:{row['category']}"
    return f"item:{row['id']}"


def clusters_of(m: pd.DataFrame) -> tuple[np.ndarray, str]:
    """(one cluster label per row, what they are): the rows' `cluster` column where every row
    has one, else the item (a multi-turn comparison's item is the conversation)."""
    if "cluster" in m.columns and m["cluster"].notna().all():
        return m["cluster"].astype(str).to_numpy(), "cluster column (arenaflow.evals.cluster)"
    return m["item_id"].astype(str).to_numpy(), ITEM


def _t_inference(mean: float, se: float | None, df: int, level: float) -> dict:
    if se is None or se <= 0 or df < 1:
        return {"se": se, "ci95": None, "t": None, "p_value": None, "df": df if df >= 1 else None}
    q = float(sps.t.ppf(0.5 + level / 2, df))
    t = mean / se
    return {
        "se": se,
        "ci95": [mean - q * se, mean + q * se],
        "t": t,
        "p_value": float(2 * sps.t.sf(abs(t), df)),
        "df": df,
    }


def clustered_se(diff, clusters) -> float | None:
    """CR1 cluster-robust SE of mean(diff) (the module docstring's formula); None with fewer
    than two clusters."""
    d = np.asarray(diff, dtype=float)
    labels = pd.factorize(np.asarray(clusters))[0]
    g = int(labels.max()) + 1 if len(labels) else 0
    if len(d) != len(labels):
        raise ValueError(f"{len(d)} differences but {len(labels)} cluster labels")
    if g < 2:
        return None
    sums = np.bincount(labels, weights=d - d.mean(), minlength=g)
    return float(np.sqrt(g / (g - 1) * np.sum(sums**2)) / len(d))


def paired_clustered(diff, clusters, by: str = ITEM, level: float = 0.95) -> dict:
    """Mean paired difference (points) with its item-level and clustered SE, CI, t and p.
    `design_effect` = (clustered SE / item SE)^2: how many times the item count overstates the
    information."""
    d = np.asarray(diff, dtype=float) * 100  # points, as every delta in a comparison
    n, g = len(d), len(pd.unique(np.asarray(clusters)))
    mean = float(d.mean()) if n else 0.0
    se_items = float(np.std(d, ddof=1) / np.sqrt(n)) if n >= 2 else None
    se_c = clustered_se(d, clusters)
    items = _t_inference(mean, se_items, n - 1, level)
    clus = _t_inference(mean, se_c, g - 1, level)
    both = se_items and se_c
    return {
        "cluster_by": by,
        "n": n,
        "n_clusters": g,
        "delta": mean,
        "items": items,
        "clustered": clus,
        "design_effect": (se_c / se_items) ** 2 if both else None,
    }
