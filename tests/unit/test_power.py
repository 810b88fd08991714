"""arenaflow.evals.power: the minimum detectable effect of a paired 0/1 comparison, against
statsmodels' power of the t test and a simulation of the paired test itself."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.power import TTestPower

from arenaflow.evals import power


def test_at_the_mde_statsmodels_gives_the_configured_power():
    for n, psi in ((300, 0.5), (120, 0.2), (1600, 0.08)):
        delta = power.mde(n, psi, alpha=0.05, power=0.8) / 100
        d = delta / np.sqrt(psi - delta**2)  # Cohen's d of the per-item differences
        assert TTestPower().power(d, n, 0.05, alternative="two-sided") == pytest.approx(0.8)


def test_the_paired_t_over_simulated_items_rejects_at_the_mde_with_that_power():
    n, psi = 300, 0.3
    delta = power.mde(n, psi) / 100
    rng = np.random.default_rng(0)
    sims = 20000
    counts = rng.multinomial(n, [(psi + delta) / 2, (psi - delta) / 2, 1 - psi], size=sims)
    w, lo = counts[:, 0], counts[:, 1]
    mean = (w - lo) / n
    var = ((w + lo) / n - mean**2) * n / (n - 1)  # sample variance of the +1/-1/0 differences
    t = mean / np.sqrt(var / n)
    rejected = np.abs(t) > sps.t.ppf(0.975, n - 1)
    assert rejected.mean() == pytest.approx(0.8, abs=0.015)  # 3 SE of 20000 draws: 0.0085


def test_the_embedded_defaults_suite_size_and_the_planning_discordance():
    assert power.planning_discordance(0.5) == 0.5
    assert power.planning_discordance(0.9) == pytest.approx(0.18)
    # 300 items at the worst-case discordance: about 11 points, far above `delta > 0`
    assert 11 < power.mde(300, 0.5) < 11.5


def test_bad_sizes_and_discordances_are_refused_naming_them():
    with pytest.raises(ValueError, match="n >= 2 items, got 1"):
        power.mde(1, 0.5)
    with pytest.raises(ValueError, match=r"discordance must be in \(0, 1\], got 0"):
        power.mde(100, 0)


def test_the_mde_of_a_measured_sd_is_statsmodels_d_times_it_and_matches_the_planned_formula():
    for n, sd in ((24, 20.4), (300, 70.0), (5000, 3.1)):
        d = TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8)
        assert power.mde_of_sd(n, sd) == pytest.approx(float(np.ravel(d)[0]) * sd)
    # the planned MDE is the measured one when the SD is that of the differences at the MDE
    n, psi = 300, 0.3
    delta = power.mde(n, psi) / 100
    assert power.mde_of_sd(n, 100 * np.sqrt(psi - delta**2)) == pytest.approx(delta * 100)
    with pytest.raises(ValueError, match="SD of the differences must be finite and > 0, got 0"):
        power.mde_of_sd(100, 0.0)
    with pytest.raises(ValueError, match="n >= 2 items, got 1"):
        power.mde_of_sd(1, 5.0)
