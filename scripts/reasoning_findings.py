"""The four comparisons of docs/reasoning.md, from a report of the reasoning sweep and its ablations.

    python scripts/reasoning_findings.py [REPORT_DIR]     (default results/sweeps/reasoning/report)

Reads the report's runs.parquet and metrics.parquet (`harness report results/sweeps/reasoning`) and
prints, per comparison, each setting's mean over seeds with its 95% bootstrap CI and the difference
with Welch's 95% CI and p (analysis/stats.py). A training metric is averaged per run over the last
quarter of its steps (the end of training, less noisy than the last step); accuracy is the final eval.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.stats import bootstrap_ci, welch  # noqa: E402

# (title, metric, (algo, variant, KL coefficient or None = any) of the reference, then of the other)
COMPARISONS = [
    ("length normalisation: tokens of incorrect responses", "rollout/response_tokens_incorrect_mean",
     ("grpo", "", 0.04), ("dr_grpo", "", None)),
    ("length normalisation: tokens of correct responses", "rollout/response_tokens_correct_mean",
     ("grpo", "", 0.04), ("dr_grpo", "", None)),
    ("length normalisation: final accuracy", "eval_final", ("grpo", "", 0.04), ("dr_grpo", "", None)),
    ("clip-higher: policy entropy", "policy/entropy", ("dapo", "algo.clip_high=0.2", None), ("dapo", "", None)),
    ("clip-higher: clipped token fraction", "policy/clipfrac", ("dapo", "algo.clip_high=0.2", None), ("dapo", "", None)),
    ("clip-higher: final accuracy", "eval_final", ("dapo", "algo.clip_high=0.2", None), ("dapo", "", None)),
    ("overlong shaping: truncated responses", "rollout/truncated_frac", ("dapo", "algo.overlong_penalty=0.0", None),
     ("dapo", "", None)),
    ("overlong shaping: response tokens", "rollout/response_tokens_mean", ("dapo", "algo.overlong_penalty=0.0", None),
     ("dapo", "", None)),
    ("overlong shaping: final accuracy", "eval_final", ("dapo", "algo.overlong_penalty=0.0", None), ("dapo", "", None)),
    ("KL term: KL(policy || start)", "kl/from_start", ("grpo", "", 0.0), ("grpo", "", 0.04)),
    ("KL term: final accuracy", "eval_final", ("grpo", "", 0.0), ("grpo", "", 0.04)),
]


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
    for title, metric, ref, other in COMPARISONS:
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
