"""Figures (seaborn, Agg backend), PNG + PDF, one fixed colour per algorithm in every figure.

Colours: built-in algorithms (``known_algos()``) have fixed slots in a fixed palette, any
other name gets a slot from a stable hash of its name (sha1, not Python's salted hash),
so an algorithm keeps its colour across figures, reports and machines.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis.collect import CONTROL_PREFIX  # noqa: E402
from analysis.stats import bootstrap_ci  # noqa: E402

_PALETTE = sns.color_palette("tab20", 20)
# Built-in algorithms (sorted names from the registry): the strong tab20 colours first, then the light ones.
_KNOWN_SLOTS = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19]


@functools.cache
def known_algos() -> tuple[str, ...]:
    import algorithms

    return tuple(algorithms.builtin())


def algo_color(name: str) -> tuple[float, float, float]:
    known = known_algos()
    if name in known and known.index(name) < len(_KNOWN_SLOTS):
        return _PALETTE[_KNOWN_SLOTS[known.index(name)]]
    h = int(hashlib.sha1(name.encode()).hexdigest(), 16)
    return _PALETTE[h % len(_PALETTE)]


def palette(names) -> dict[str, tuple[float, float, float]]:
    return {n: algo_color(n) for n in sorted(set(names))}


CURVES = [
    # (file stem, x column, y column, x label, y label)
    ("accuracy_vs_step", "x_step", "eval_acc", "RL step", "eval accuracy"),
    ("accuracy_vs_tokens", "x_tokens", "eval_acc", "generated tokens (training)", "eval accuracy"),
    ("accuracy_vs_wall", "x_wall", "eval_acc", "training wall time (s)", "eval accuracy"),
    ("response_length", "step", "rollout/response_tokens_mean", "RL step", "mean response tokens"),
    ("entropy", "step", "policy/entropy", "RL step", "policy entropy"),
    # against the budget's own axis, for comparing algorithms that spend tokens differently (issue #30)
    ("length_correct_vs_tokens", "x_tokens", "rollout/response_tokens_correct_mean", "generated tokens (training)",
     "mean tokens of correct responses"),
    ("length_incorrect_vs_tokens", "x_tokens", "rollout/response_tokens_incorrect_mean", "generated tokens (training)",
     "mean tokens of incorrect responses"),
    ("entropy_vs_tokens", "x_tokens", "policy/entropy", "generated tokens (training)", "policy entropy"),
    ("clipfrac_vs_tokens", "x_tokens", "policy/clipfrac", "generated tokens (training)", "clipped token fraction"),
    ("truncated_vs_tokens", "x_tokens", "rollout/truncated_frac", "generated tokens (training)", "truncated responses"),
    ("kl_vs_tokens", "x_tokens", "kl/from_start", "generated tokens (training)", "KL(policy || start), nats"),
]


CONTROL_GREY = (0.45, 0.45, 0.45)


def _save(fig, out: Path, stem: str) -> list[Path]:
    paths = []
    for ext in ("png", "pdf"):
        p = out / f"{stem}.{ext}"
        fig.savefig(p, dpi=150 if ext == "png" else None, bbox_inches="tight")
        paths.append(p)
    plt.close(fig)
    return paths


# Knobs shown as table columns rather than variant labels: a curve label names them where one
# algorithm ran with several values (two KL coefficients must not pool into one curve).
LABEL_KNOBS = ("kl_coef", "loss_agg", "std_norm", "kl_placement", "kl_kind", "checker", "model", "tuning", "env",
               "pipeline")


def _settings(runs: pd.DataFrame) -> pd.Series:
    """Curve label per run (indexed like ``runs``): algo [variant], plus each table knob that varies
    among the algorithm's runs of a task (e.g. 'KL 0'), plus the warm start when a task's runs began
    from several."""
    label = runs["algo"] + runs["variant"].map(lambda v: f" [{v}]" if v else "")
    kl_named = pd.Series(False, index=runs.index)
    for col in (c for c in LABEL_KNOBS if c in runs):
        varies = runs.groupby(["task", "algo", "variant"])[col].transform(lambda v: v.astype(str).nunique() > 1)
        if col == "kl_coef":
            kl_named = varies.astype(bool)
        elif col == "kl_placement":  # KL 0 has no placement: the coefficient already says it
            varies = varies.astype(bool) & ~kl_named
        text = runs[col].map(lambda v, c=col: f"KL {v:g}" if c == "kl_coef" and isinstance(v, (int, float)) else f"{c} {v}")
        label = label.where(~varies.astype(bool), label + " " + text)
    if "warm_start" in runs and runs.groupby("task")["warm_start"].transform("nunique").gt(1).any():
        several = runs.groupby("task")["warm_start"].transform("nunique").gt(1)
        label = label.where(~several, label + " @" + runs["warm_start"].astype(str).str[:6])
    return label


LENGTHS = (("rollout/response_tokens_correct_mean", "correct responses"),
           ("rollout/response_tokens_incorrect_mean", "incorrect responses"))


def _length_by_correctness(tm: pd.DataFrame, settings: list[str], setting_pal: dict, dashes: bool, out: Path,
                           suffix: str, task: str) -> list[Path]:  # fmt: skip
    """Mean tokens of correct and of incorrect training responses vs generated tokens, side by side on
    one y scale: whether an algorithm lengthens the answers it gets right (working problems out) or
    the ones it gets wrong (rambling), which Dr. GRPO's length-bias argument is about."""
    if not all(col in tm.columns and tm[col].notna().any() for col, _ in LENGTHS):
        return []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (col, title) in zip(axes, LENGTHS):
        sns.lineplot(data=tm[tm[col].notna()], x="x_tokens", y=col, hue="setting", hue_order=settings,
                     palette=setting_pal, style="setting" if dashes else None, errorbar=bootstrap_ci, ax=ax,
                     legend=ax is axes[-1])  # fmt: skip
        ax.set(xlabel="generated tokens (training)", ylabel="mean response tokens", title=f"{task}: {title}")
    axes[-1].legend(title=None, fontsize=7)
    return _save(fig, out, "length_by_correctness_vs_tokens" + suffix)


OVEROPT = ("kl/from_start", "reward/model_mean", "reward/gold_mean")


def _overoptimisation(tm: pd.DataFrame, settings: list[str], setting_pal: dict, out: Path, suffix: str,
                      task: str) -> list[Path]:  # fmt: skip
    """Runs trained on a reward model: the proxy (reward-model) and gold (checker) reward of the
    training rollouts against KL(policy || starting policy), the over-optimisation picture of
    Gao et al. 2022 (arXiv:2210.10760, fig. 1): the proxy keeps rising while the gold reward
    flattens or falls. Steps are binned by KL (12 equal bins per setting, seeds pooled); each
    point is a bin's mean KL and reward, so a KL that wanders back does not zigzag the curve."""
    if not all(c in tm.columns for c in OVEROPT):
        return []
    d = tm[tm[list(OVEROPT)].notna().all(axis=1)]
    if d.empty:
        return []
    binned = []
    for setting, sd in d.groupby("setting"):
        edges = np.linspace(sd["kl/from_start"].min(), sd["kl/from_start"].max() + 1e-9, 13)
        bins = pd.cut(sd["kl/from_start"], edges, include_lowest=True)
        binned.append(sd.groupby(bins, observed=True)[list(OVEROPT)].mean().assign(setting=setting))
    agg = pd.concat(binned, ignore_index=True)
    shown = [s for s in settings if s in set(agg["setting"])]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, y, label in zip(axes, OVEROPT[1:], ("proxy reward (reward model)", "gold reward (checker)")):
        sns.lineplot(data=agg, x="kl/from_start", y=y, hue="setting", hue_order=shown, palette=setting_pal,
                     marker="o", markersize=4, estimator=None, ax=ax)  # fmt: skip
        ax.set(xlabel="KL(policy || start), nats per response", ylabel=label, title=f"{task}: {label}")
        ax.legend(title=None, fontsize=7)
    return _save(fig, out, "overoptimisation" + suffix)


def make_plots(runs: pd.DataFrame, metrics: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """All figures for every task; returns the written paths.

    Curves are mean over seeds with a 95% bootstrap band: the tables' own interval (analysis.stats.bootstrap_ci,
    fixed seed, one vectorised draw; seaborn's own bootstrap loops in Python and took 2 of make run's
    minutes). Seeds are
    aggregated per step (training curves) or per eval (the k-th eval of each seed: with
    evals every N tokens seeds evaluate at different steps), each point placed at the seeds'
    mean step / tokens / wall time there, never at (unequal) raw x values. Runs from
    different warm starts are different curves.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    sns.set_theme(style="whitegrid", context="paper")
    m = metrics.copy()
    labels = dict(zip(runs["run_dir"], _settings(runs)))
    m["setting"] = m["run_dir"].map(labels)
    m["eval_index"] = m[m["eval_acc"].notna()].groupby("run_dir").cumcount()
    steps = m.groupby(["task", "setting", "step"])
    m["x_step"] = m["step"].astype(float)
    m["x_tokens"] = steps["budget/generated_tokens"].transform("mean")
    m["x_wall"] = steps["budget/wall_s"].transform("mean")
    evals = m[m["eval_index"].notna()].groupby(["task", "setting", "eval_index"])
    for x, col in (("x_step", "step"), ("x_tokens", "budget/generated_tokens"), ("x_wall", "budget/wall_s")):
        m.loc[m["eval_index"].notna(), x] = evals[col].transform("mean")
    pal = palette(m["algo"])
    for task, tm in m.groupby("task", sort=True):
        suffix = f"_{task}" if m["task"].nunique() > 1 else ""
        settings = sorted(tm["setting"].unique())
        # A control row (a random reward) in grey: the floor the others are read against, not a contender.
        setting_pal = {s: CONTROL_GREY if f"[{CONTROL_PREFIX}" in s else pal[tm.loc[tm["setting"] == s, "algo"].iloc[0]]
                       for s in settings}  # fmt: skip
        dashes = (tm.groupby("setting")["algo"].first() != pd.Series(settings, index=settings)).any()
        for stem, x, y, xl, yl in CURVES:
            if y not in tm.columns:
                continue
            d = tm[tm[y].notna()]
            if d.empty:
                continue
            fig, ax = plt.subplots(figsize=(6, 4))
            sns.lineplot(data=d, x=x, y=y, hue="setting", hue_order=settings, palette=setting_pal,
                         style="setting" if dashes else None, errorbar=bootstrap_ci,
                         marker="o" if y == "eval_acc" else None, markersize=4, ax=ax)
            ax.set(xlabel=xl, ylabel=yl, title=f"{task}: {yl} vs {xl.split(' (')[0]}")
            ax.legend(title=None, fontsize=7)
            written += _save(fig, out, stem + suffix)
        written += _length_by_correctness(tm, settings, setting_pal, dashes, out, suffix, task)
        written += _overoptimisation(tm, settings, setting_pal, out, suffix, task)
        # Final accuracy bars with error bars (95% bootstrap CI over seeds) and the seeds as dots.
        tr = runs[runs["task"] == task].copy()
        tr["setting"] = tr["run_dir"].map(labels)
        fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(settings) + 2), 4))
        sns.barplot(data=tr, x="setting", y="eval_final", hue="setting", order=settings, hue_order=settings,
                    palette=setting_pal, errorbar=bootstrap_ci, capsize=0.2, ax=ax, legend=False)
        sns.stripplot(data=tr, x="setting", y="eval_final", order=settings, color="black", size=3, ax=ax)
        ax.set(xlabel="", ylabel="final eval accuracy", title=f"{task}: final accuracy (mean, 95% CI over seeds)")
        ax.tick_params(axis="x", rotation=30)
        for lab in ax.get_xticklabels():
            lab.set_horizontalalignment("right")
        written += _save(fig, out, "final_accuracy" + suffix)
    return written
