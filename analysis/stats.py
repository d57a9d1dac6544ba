"""Statistics over seeds, numpy only (no scipy): bootstrap CIs and a permutation test."""

from __future__ import annotations

import itertools
import math

import numpy as np

RNG_SEED = 0
N_BOOT = 10_000
N_PERM = 10_000
EXACT_PERM_LIMIT = 20_000  # enumerate every split when there are at most this many


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


def permutation_test(a, b, n_perm: int = N_PERM, seed: int = RNG_SEED) -> float:
    """Two-sided p-value of mean(a) - mean(b) under random relabelling of the pooled seeds.

    Exact (every split enumerated) when there are at most EXACT_PERM_LIMIT splits, else
    Monte Carlo with ``n_perm`` draws and the (k + 1) / (n + 1) correction. With 2 vs 2
    seeds the smallest attainable p is 1/3: few seeds cannot show significance.
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if len(a) == 0 or len(b) == 0:
        return float("nan")
    pooled = np.concatenate([a, b])
    n, k = len(pooled), len(a)
    observed = abs(a.mean() - b.mean())
    tol = 1e-12 * max(1.0, abs(observed))
    total = pooled.sum()
    if math.comb(n, k) <= EXACT_PERM_LIMIT:
        idx = np.array(list(itertools.combinations(range(n), k)))
        sa = pooled[idx].sum(axis=1)
        diffs = np.abs(sa / k - (total - sa) / (n - k))
        return float(np.mean(diffs >= observed - tol))
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((n_perm, n)), axis=1)[:, :k]
    sa = pooled[perms].sum(axis=1)
    diffs = np.abs(sa / k - (total - sa) / (n - k))
    return float((np.sum(diffs >= observed - tol) + 1) / (n_perm + 1))
