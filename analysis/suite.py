"""A benchmark suite's verdict: aggregates over tasks with the rliable package.

Agarwal et al. 2021, "Deep Reinforcement Learning at the Edge of the Statistical Precipice"
(NeurIPS): with few runs per task, report interval estimates of robust aggregates over the
whole suite instead of per-task point estimates. Each run's final accuracy on a task is
normalised between a floor and a ceiling (by default the task's starting accuracy, the mean
step-0 eval of its runs, i.e. the warm start's, and 1.0), giving a (runs x tasks) score matrix per
algorithm. From it, with stratified bootstrap CIs (rliable, resampling runs within each task):

* IQM: the mean of the middle 50% of all run-task scores (robust to outlying runs and tasks);
* mean, and the optimality gap: how far below 1.0 (the ceiling) the mean score falls, scores
  above 1 counting as 1;
* the probability of improvement P(X > Y): the chance that a run of X beats a run of Y on a
  task picked at random (Mann-Whitney U, averaged over tasks), for each algorithm over the baseline;
* performance profiles: the fraction of run-task scores above each threshold tau.

rliable 1.2 calls arch's bootstrap with ``random_state=``, which arch 8 names ``seed=`` (and the
arch 7 that rliable pins does not import under pandas 3): ``_arch_compat`` passes it on under
its new name. rliable resamples with numpy's global generator, so every call here seeds it (and
puts its state back): the same intervals on every machine.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

SEED = 0
REPS = 2000  # bootstrap resamples (rliable's default)
TAUS = np.linspace(0.0, 1.0, 21)  # performance-profile thresholds, normalised score


class SuiteError(ValueError):
    """Runs that do not make a suite: one task, or algorithms without runs on every task."""


def _arch_compat() -> None:
    """arch >= 8 renamed the bootstraps' ``random_state`` to ``seed``; rliable 1.2 still passes the old name."""
    from arch.bootstrap import IIDBootstrap

    init = IIDBootstrap.__init__
    if "random_state" in inspect.signature(init).parameters or getattr(init, "_harness_compat", False):
        return

    def compat(self, *args, random_state=None, seed=None, **kwargs):
        init(self, *args, seed=seed if seed is not None else random_state, **kwargs)

    compat._harness_compat = True
    IIDBootstrap.__init__ = compat


@contextmanager
def _seeded(seed: int):
    """numpy's global generator seeded (rliable draws from it) and put back; and the root logger's handlers
    put back: rliable logs through absl, which gives the root logger a handler on the sys.stderr of the
    moment (under pytest a capture file, closed later)."""
    state, handlers = np.random.get_state(), list(logging.root.handlers)
    np.random.seed(seed)
    try:
        yield np.random.RandomState(seed)
    finally:
        np.random.set_state(state)
        logging.root.handlers[:] = handlers


def _rliable():
    try:
        from rliable import library, metrics
    except Exception as exc:  # absent, or its arch 7 failing to import under pandas 3
        raise SuiteError(f"suite aggregates need the rliable package ({exc}): make install, or "
                         f"pip install --no-deps rliable==1.2.0 absl-py 'arch>=8'") from None  # fmt: skip
    _arch_compat()
    # absl (rliable logs through it) made a handler on the sys.stderr of its import; a later logging set-up
    # (Hydra's dictConfig in the same process) closes every handler, and absl then closes that stream
    # unless it is the interpreter's own: under pytest, the capture file of every later test.
    from absl import logging as absl_logging

    absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__
    return library, metrics


@dataclass(frozen=True)
class Suite:
    """Normalised final scores: per algorithm a (runs x tasks) matrix, tasks in ``tasks`` order."""

    scores: dict[str, np.ndarray]
    tasks: list[str]
    bounds: dict[str, tuple[float, float]]  # task -> (floor, ceiling) of the normalisation
    notes: tuple[str, ...] = ()  # what was left out (algorithms missing a task, runs past the common count)


def suite_scores(runs: pd.DataFrame, bounds: Mapping[str, tuple[float | None, float]] | None = None,
                 column: str = "eval_final") -> Suite:  # fmt: skip
    """The suite of ``runs`` (one row per run: algo, task, seed, ``column``, eval_first).

    ``bounds``: task -> (floor, ceiling); a floor of None (or a task left out) is the task's mean
    ``eval_first`` over its runs (the starting model's accuracy), the ceiling default 1.0. An
    algorithm without runs on every task is left out (noted); an algorithm needs as many runs on
    every task (rliable's matrix): per task its runs of the lowest seeds are kept, the rest noted."""
    bounds = dict(bounds or {})
    tasks = sorted(runs["task"].unique())
    if len(tasks) < 2:
        raise SuiteError(f"a suite needs runs on 2 or more tasks; these are all on {tasks}")
    resolved: dict[str, tuple[float, float]] = {}
    for task in tasks:
        floor, ceiling = bounds.get(task, (None, 1.0))
        floor = float(runs.loc[runs["task"] == task, "eval_first"].mean()) if floor is None else float(floor)
        if not ceiling > floor:
            raise SuiteError(f"task {task}: ceiling {ceiling} must lie above floor {floor}")
        resolved[task] = (floor, float(ceiling))
    scores, notes = {}, []
    for algo, group in runs.groupby("algo", sort=True):
        per_task = [group[group["task"] == t].sort_values("seed")[column].to_numpy(float) for t in tasks]
        missing = [t for t, x in zip(tasks, per_task) if len(x) == 0]
        if missing:
            notes.append(f"{algo} left out: no runs on {', '.join(missing)}")
            continue
        n = min(len(x) for x in per_task)
        extra = {t: len(x) - n for t, x in zip(tasks, per_task) if len(x) > n}
        if extra:
            notes.append(f"{algo}: {n} runs per task kept (the lowest seeds); left out: "
                         + ", ".join(f"{k} on {t}" for t, k in extra.items()))
        matrix = np.stack([x[:n] for x in per_task], axis=1)  # runs x tasks
        floors = np.array([resolved[t][0] for t in tasks])
        ceilings = np.array([resolved[t][1] for t in tasks])
        scores[str(algo)] = (matrix - floors) / (ceilings - floors)
    if not scores:
        raise SuiteError("no algorithm has runs on every task (" + "; ".join(notes) + ")")
    return Suite(scores, tasks, resolved, tuple(notes))


def aggregate_table(suite: Suite, baseline: str | None = None, reps: int = REPS, seed: int = SEED) -> pd.DataFrame:
    """One row per algorithm: runs, IQM, mean and optimality gap with 95% stratified-bootstrap CIs, and
    P(algorithm > baseline) with its CI (the baseline's own row: blank)."""
    library, metrics = _rliable()

    def aggregates(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x), metrics.aggregate_optimality_gap(x)])

    points, intervals = {}, {}
    for algo, x in suite.scores.items():  # seeded per algorithm: its interval does not depend on the others
        with _seeded(seed) as rng:
            p, i = library.get_interval_estimates({algo: x}, aggregates, reps=reps, random_state=rng)
        points[algo], intervals[algo] = p[algo], i[algo]
    rows = []
    for algo, x in suite.scores.items():
        (iqm, mean, gap), ci = points[algo], intervals[algo]
        rows.append({"algo": algo, "runs": x.shape[0], "tasks": x.shape[1],
                     "iqm": iqm, "iqm_low": ci[0, 0], "iqm_high": ci[1, 0],
                     "mean": mean, "mean_low": ci[0, 1], "mean_high": ci[1, 1],
                     "optimality_gap": gap, "gap_low": ci[0, 2], "gap_high": ci[1, 2]})  # fmt: skip
    table = pd.DataFrame(rows)
    if baseline is not None:
        if baseline not in suite.scores:
            raise SuiteError(f"baseline {baseline!r} has no runs in this suite ({', '.join(suite.scores)})")
        p_points, p_intervals = {}, {}
        for algo, x in suite.scores.items():
            if algo == baseline:
                continue
            with _seeded(seed) as rng:  # P(algo > baseline): rliable calls the metric as f(x, baseline)
                p, i = library.get_interval_estimates({algo: (x, suite.scores[baseline])},
                                                      metrics.probability_of_improvement, reps=reps, random_state=rng)
            p_points[algo], p_intervals[algo] = p[algo], i[algo]
        table["p_improve"] = table["algo"].map(lambda a: p_points.get(a, np.nan))
        bound = {a: np.ravel(ci).astype(float) for a, ci in p_intervals.items()}  # (low, high)
        table["p_low"] = table["algo"].map(lambda a: bound[a][0] if a in bound else np.nan)
        table["p_high"] = table["algo"].map(lambda a: bound[a][1] if a in bound else np.nan)
    return table.sort_values("iqm", ascending=False).reset_index(drop=True)


def performance_profiles(suite: Suite, taus: np.ndarray = TAUS, reps: int = REPS,
                         seed: int = SEED) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:  # fmt: skip
    """Per algorithm: the fraction of run-task scores above each tau, and its CI (2 x len(taus))."""
    library, _ = _rliable()
    with _seeded(seed):
        return library.create_performance_profile(suite.scores, taus, reps=reps)


def plot_suite(suite: Suite, table: pd.DataFrame, out_dir: Path, seed: int = SEED) -> list[Path]:
    """suite_intervals.png (IQM, mean, optimality gap with CIs) and suite_profiles.png, in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import plot_utils

    out_dir.mkdir(parents=True, exist_ok=True)
    algos = list(table["algo"])
    rows = table.set_index("algo")
    points = {a: rows.loc[a, ["iqm", "mean", "optimality_gap"]].to_numpy(float) for a in algos}
    intervals = {a: np.stack([rows.loc[a, ["iqm_low", "mean_low", "gap_low"]].to_numpy(float),
                              rows.loc[a, ["iqm_high", "mean_high", "gap_high"]].to_numpy(float)]) for a in algos}
    fig, _ = plot_utils.plot_interval_estimates(points, intervals, metric_names=["IQM", "Mean", "Optimality gap"],
                                                algorithms=algos, xlabel="normalised score", subfigure_width=3.6,
                                                row_height=0.5, xlabel_y_coordinate=-0.35)  # fmt: skip
    paths = [out_dir / "suite_intervals.png", out_dir / "suite_profiles.png"]
    fig.savefig(paths[0], bbox_inches="tight", dpi=120)
    plt.close(fig)
    profiles, cis = performance_profiles(suite, seed=seed)
    fig, ax = plt.subplots(figsize=(6, 4))
    plot_utils.plot_performance_profiles(profiles, TAUS, performance_profile_cis=cis, xlabel=r"normalised score $\tau$",
                                         ax=ax)  # fmt: skip
    fig.savefig(paths[1], bbox_inches="tight", dpi=120)
    plt.close(fig)
    return paths


def _ci(row: pd.Series, point: str, low: str, high: str) -> str:
    return f"{row[point]:.3f} [{row[low]:.3f}, {row[high]:.3f}]"


def suite_markdown(suite: Suite, table: pd.DataFrame, baseline: str | None) -> str:
    """The aggregate table, with the normalisation it rests on."""
    headers = ["algorithm", "runs/task", "IQM [95% CI]", "mean [95% CI]", "optimality gap [95% CI]"]
    if baseline is not None and "p_improve" in table:
        headers.append(f"P(> {baseline}) [95% CI]")
    lines = [f"## Suite: {len(suite.tasks)} tasks, normalised scores (rliable)", "",
             "| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]  # fmt: skip
    for _, row in table.iterrows():
        cells = [str(row["algo"]), str(int(row["runs"])), _ci(row, "iqm", "iqm_low", "iqm_high"),
                 _ci(row, "mean", "mean_low", "mean_high"), _ci(row, "optimality_gap", "gap_low", "gap_high")]  # fmt: skip
        if len(headers) == 6:
            cells.append("" if pd.isna(row["p_improve"]) else _ci(row, "p_improve", "p_low", "p_high"))
        lines.append("| " + " | ".join(cells) + " |")
    bounds = ", ".join(f"{t} [{lo:.3f}, {hi:.3f}]" for t, (lo, hi) in suite.bounds.items())
    lines += ["", f"- Score per run and task: (final accuracy - floor) / (ceiling - floor); {bounds} "
              "(floor: the task's mean step-0 accuracy unless stated).",
              f"- 95% stratified bootstrap CIs over runs within tasks ({REPS} resamples, seed {SEED}); IQM: mean of "
              "the middle 50% of run-task scores; optimality gap: 1 - mean of scores capped at 1; P(X > Y): "
              "probability that a run of X beats a run of Y on a random task (Agarwal et al. 2021).",
              *[f"- {note}" for note in suite.notes], ""]  # fmt: skip
    return "\n".join(lines)
