"""Minimum detectable effect of a paired comparison of 0/1 outcomes on n items.

The test is the paired t over items (t_items; McNemar's exact test is its small-sample twin on
the same discordant pairs). With discordance psi (the chance that the two arms disagree on an
item) and a true delta, a per-item difference has variance psi - delta^2, so Cohen's d of the
differences is delta / sqrt(psi - delta^2). statsmodels' TTestPower solves d for n, alpha and
power; the delta it implies is d * sqrt(psi / (1 + d^2)). No command of its own:
arenaflow.rounds.gate computes a round's MDE at registration with it (`mde`, from planning
values) and again at nomination (`mde_of_sd`, from the SD of the differences it measured).
"""

from __future__ import annotations

import functools
import math

import numpy as np


def planning_discordance(parent_accuracy: float) -> float:
    """2p(1-p): the discordance of two arms at accuracy p (a fraction) whose outcomes are
    independent, the most a pair of arms of that accuracy disagrees without anti-correlation:
    the conservative planning value when nothing measured says how much pairing helps."""
    return 2 * parent_accuracy * (1 - parent_accuracy)


@functools.lru_cache(maxsize=256)  # a nomination asks once per clause and candidate
def cohens_d(n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The standardised effect (mean / SD of the per-unit differences) a two-sided one-sample t
    on `n` independent units detects at `alpha` with `power` (statsmodels' TTestPower)."""
    if n < 2:
        raise ValueError(f"a minimum detectable effect needs n >= 2 items, got {n}")
    from statsmodels.stats.power import TTestPower  # ~2 s to import; config resolution loads us

    d = TTestPower().solve_power(
        effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided"
    )
    return float(np.ravel(d)[0])  # statsmodels returns a scalar or, from some n, a 1-element array


def mde(n: int, discordance: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest |delta| (points) a two-sided paired test at `alpha` detects with `power` on
    `n` independent items whose arms disagree with probability `discordance`."""
    if not 0 < discordance <= 1:
        raise ValueError(f"discordance must be in (0, 1], got {discordance}")
    d = cohens_d(n, alpha, power)
    return 100 * d * math.sqrt(discordance / (1 + d**2))


def mde_of_sd(n: int, sd: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest |delta| (points) the paired t on `n` independent units detects when their
    differences have the measured standard deviation `sd` (points): Cohen's d times sd."""
    if not (math.isfinite(sd) and sd > 0):
        raise ValueError(f"the SD of the differences must be finite and > 0, got {sd}")
    return cohens_d(n, alpha, power) * sd
