"""Statistics over seeds: bootstrap CIs, Welch's t-test with a CI of the difference, Holm's
correction over many comparisons with one baseline, the minimal detectable difference.

(A permutation test was used before; with n seeds a side its two-sided p cannot go below
2 / C(2n, n), 1/3 for two seeds, so the table could never show a significant difference.)"""

from __future__ import annotations

import math

import numpy as np

RNG_SEED = 0
N_BOOT = 10_000


def mean_std(x) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for a single seed)."""
    x = np.asarray(x, float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return float("nan"), float("nan")
    return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else 0.0


def bootstrap_ci(x, level: float = 0.95, n_boot: int = N_BOOT, seed: int = RNG_SEED) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over seeds (fixed RNG seed, so reports are reproducible)."""
    x = np.asarray(x, float)
    x = x[~np.isnan(x)]
    if len(x) == 0:
        return float("nan"), float("nan")
    if len(x) == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


ALPHA = 0.05
POWER = 0.8


def welch(a, b, level: float = 0.95) -> tuple[float, float, float]:
    """(p, ci_lo, ci_hi): Welch's two-sided t-test of mean(a) - mean(b) and the CI of that
    difference (scipy). NaNs with fewer than 2 seeds a side or no variance on either side."""
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if len(a) < 2 or len(b) < 2 or (a.var() == 0 and b.var() == 0):
        return float("nan"), float("nan"), float("nan")
    res = stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(level)
    return float(res.pvalue), float(ci.low), float(ci.high)


def holm(pvalues) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (statsmodels) over the non-NaN entries; NaNs stay NaN."""
    from statsmodels.stats.multitest import multipletests

    p = np.asarray(pvalues, float)
    out = np.full_like(p, np.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = multipletests(p[ok], alpha=ALPHA, method="holm")[1]
    return out


def mde(a, b, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimal detectable difference of two means at ``alpha`` (two-sided) and ``power``:
    the standardised effect a two-sample t-test detects with these seed counts (statsmodels'
    TTestIndPower), times the pooled seed standard deviation observed. NaN below 2 seeds."""
    from statsmodels.stats.power import TTestIndPower

    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return float("nan")
    pooled_sd = math.sqrt(((n1 - 1) * a.var(ddof=1) + (n2 - 1) * b.var(ddof=1)) / (n1 + n2 - 2))
    if pooled_sd == 0:
        return float("nan")  # no spread observed: nothing to size the test with
    effect = TTestIndPower().solve_power(nobs1=n1, ratio=n2 / n1, alpha=alpha, power=power, alternative="two-sided")
    return float(effect * pooled_sd)
