"""The four comparisons of docs/reasoning.md, from a report of the reasoning sweep and its ablations.

    python scripts/reasoning_findings.py [REPORT_DIR]     (default results/sweeps/reasoning/report)

Reads the report's runs.parquet and metrics.parquet (`harness report results/sweeps/reasoning`) and
prints, per comparison, each setting's mean over seeds with its 95% bootstrap CI and the difference
with Welch's 95% CI and p (analysis/stats.py); the comparisons are listed in sweeps/reasoning.findings.json. A training metric is averaged per run over the last
quarter of its steps (the end of training, less noisy than the last step); accuracy is the final eval.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.stats import bootstrap_ci, welch  # noqa: E402

# The comparisons (which settings, which metric) are data beside the preset: sweeps/reasoning.findings.json.
FINDINGS = Path(__file__).resolve().parents[1] / "sweeps" / "reasoning.findings.json"


def per_run(runs: pd.DataFrame, metrics: pd.DataFrame, metric: str) -> pd.Series:
    """run_dir -> the final eval accuracy, or the metric's mean over the run's last quarter of steps."""
    if metric == "eval_final":
        return runs.set_index("run_dir")["eval_final"]
    out = {}
    for run_dir, m in metrics[metrics[metric].notna()].groupby("run_dir") if metric in metrics else []:
        m = m.sort_values("step")
        out[run_dir] = float(m[metric].iloc[-max(1, len(m) // 4):].mean())
    return pd.Series(out, dtype=float)


def select(runs: pd.DataFrame, algo: str, variant: str, kl: float | None) -> pd.DataFrame:
    rows = runs[(runs["algo"] == algo) & (runs["variant"].fillna("") == variant)]
    return rows if kl is None else rows[np.isclose(rows["kl_coef"].astype(float), kl)]


def label(algo: str, variant: str, kl: float | None) -> str:
    return algo + (f" [{variant}]" if variant else "") + (f" KL {kl:g}" if kl is not None else "")


def main(report_dir: str = "results/sweeps/reasoning/report") -> int:
    report = Path(report_dir)
    if not (report / "runs.parquet").exists():
        print(f"no {report / 'runs.parquet'}: run `harness report results/sweeps/reasoning` first")
        return 1
    runs, metrics = pd.read_parquet(report / "runs.parquet"), pd.read_parquet(report / "metrics.parquet")
    comparisons = json.loads(FINDINGS.read_text())["comparisons"]
    for c in comparisons:
        title, metric, ref, other = c["title"], c["metric"], tuple(c["reference"]), tuple(c["other"])
        values = per_run(runs, metrics, metric)
        sides = [values.reindex(select(runs, *s)["run_dir"]).dropna().to_numpy() for s in (ref, other)]
        if not all(len(x) for x in sides):
            print(f"{title}: no runs of {label(*ref) if not len(sides[0]) else label(*other)} (skipped)")
            continue
        text = []
        for s, x in zip((ref, other), sides):
            lo, hi = bootstrap_ci(x)
            text.append(f"{label(*s)} {x.mean():.3f} [{lo:.3f}, {hi:.3f}] ({len(x)} seeds)")
        p, dlo, dhi = welch(sides[1], sides[0])
        print(f"{title} ({metric}): {text[0]}; {text[1]}; "
              f"difference {sides[1].mean() - sides[0].mean():+.3f} [{dlo:+.3f}, {dhi:+.3f}], Welch p {p:.2g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:2]))
