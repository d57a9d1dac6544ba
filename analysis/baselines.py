"""Pinned baselines: a small fixed sweep whose results must stay inside committed bands.

``harness baselines check`` runs the preset ``sweeps/baselines.yaml`` (a few algorithms x a
few seeds on arith at a reduced token budget) and compares, per algorithm, the mean over
seeds of each banded metric with the band in ``sweeps/baselines.bands.json``; any value
outside its band, a seed count other than the recorded one, other warm-start weights, or a
pinned algorithm without finished runs fails the check (exit 1). CI runs it, so a change that
moves an algorithm's result past its band cannot land. The bands are as wide as the seed
spread allows (grpo's final accuracy: +-0.16 with 3 seeds): they catch breakage and large
shifts; tests/algorithms/test_pinned_metrics.py pins the first 3 steps of every algorithm on any
machine (docs/reproducibility.md).

Bands are recorded with ``harness baselines record``: mean over seeds +- max(MIN_MARGIN,
se_multiple x sqrt(2) x the standard error over seeds) -- sqrt(2): the check compares two
means, each with that error. RL trajectories differ between CPUs that
round differently (AVX2 vs AVX-512), as between seeds, so the seed spread sets the band
width; ``MIN_MARGIN`` keeps a floor under it for each metric's own measurement noise. This
module only reads run directories (it never imports harness.config).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

# run-table column -> what it is
METRICS = {
    "eval_final": "eval accuracy (temperature 0) at the end of the budget",
    "auc": "area under eval accuracy vs step / steps",
    "train_accuracy": "mean sampled accuracy over all training steps",
}
# Smallest band half-width per metric: the metric's own noise floor (one eval of 128 prompts
# has a binomial error of ~0.03; AUC averages ~9 evals; training accuracy ~50k samples).
MIN_MARGIN = {"eval_final": 0.04, "auc": 0.02, "train_accuracy": 0.01}


@dataclass
class BandResult:
    algo: str
    metric: str
    value: float  # mean over seeds now
    lo: float
    hi: float
    n_seeds: int

    expected_seeds: int = 0

    @property
    def verdict(self) -> str:
        if self.expected_seeds and self.n_seeds != self.expected_seeds:
            return f"SEEDS {self.n_seeds}/{self.expected_seeds}"
        return "ok" if self.ok else "OUT OF BAND"

    @property
    def ok(self) -> bool:
        tol = 1e-9  # a rerun that reproduces the recorded value exactly is inside its band
        if self.expected_seeds and self.n_seeds != self.expected_seeds:
            return False  # a crashed seed must not pass silently
        return not math.isnan(self.value) and self.lo - tol <= self.value <= self.hi + tol


def bands_path(preset: str | Path) -> Path:
    """``sweeps/baselines.yaml`` -> ``sweeps/baselines.bands.json``."""
    preset = Path(preset)
    return preset.with_name(f"{preset.stem}.bands.json")


def summarise(runs: pd.DataFrame) -> dict[str, dict[str, tuple[float, float, int]]]:
    """algo -> metric -> (mean over seeds, sample std, seeds)."""
    out: dict[str, dict[str, tuple[float, float, int]]] = {}
    for algo, g in runs.groupby("algo"):
        out[str(algo)] = {}
        for metric in METRICS:
            x = g[metric].to_numpy(float)
            x = x[~np.isnan(x)]
            sd = float(x.std(ddof=1)) if len(x) > 1 else 0.0
            out[str(algo)][metric] = (float(x.mean()) if len(x) else float("nan"), sd, len(x))
    return out


def make_bands(runs: pd.DataFrame, min_margin: float | None, se_multiple: float) -> dict:
    """Bands around the measured means: +- max(min_margin (default: MIN_MARGIN per metric),
    se_multiple x sqrt(2) x std / sqrt(seeds)); metrics the runs do not have (NaN) get no band."""
    bands: dict = {}
    for algo, metrics in summarise(runs).items():
        bands[algo] = {}
        for metric, (mean, sd, n) in metrics.items():
            if math.isnan(mean):
                continue
            floor = MIN_MARGIN.get(metric, 0.0) if min_margin is None else min_margin
            half = max(floor, se_multiple * math.sqrt(2.0) * sd / math.sqrt(max(n, 1)))
            bands[algo][metric] = {"measured": mean, "seed_std": sd, "seeds": n, "lo": mean - half, "hi": mean + half}
    return bands


def check(runs: pd.DataFrame, bands: dict) -> tuple[list[BandResult], list[str]]:
    """Every banded (algo, metric) against the runs; returns (results, algorithms without runs)."""
    now = summarise(runs) if len(runs) else {}
    results, missing = [], []
    for algo, metrics in sorted(bands.items()):
        if algo not in now:
            missing.append(algo)
            continue
        for metric, band in sorted(metrics.items()):
            mean, _, n = now[algo].get(metric, (float("nan"), 0.0, 0))
            results.append(BandResult(algo, metric, mean, float(band["lo"]), float(band["hi"]), n,
                                      int(band.get("seeds", 0))))
    return results, missing


def read_bands(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no bands file {path}: record it with `harness baselines record`")
    data = json.loads(path.read_text())
    if not isinstance(data.get("bands"), dict) or not data["bands"]:
        raise ValueError(f"{path}: expected a non-empty 'bands' mapping (algo -> metric -> lo/hi)")
    return data
