"""Report columns declared once: what a column reads from each run, how a row's seeds combine it,
and how its cell prints. One declaration feeds every output of ``harness report``: the console and
Markdown tables, the CSV (each value under its own name) and the LaTeX table.

A column is registered by name in ``REPORT_COLUMNS`` (the shared Registry: did-you-mean, the
``harness.report_columns`` entry points, ``harness report --plugins MODULE``)::

    from analysis.columns import Column, register_column, training_mean

    register_column("response_tokens", Column(
        header="response tokens",
        values={"response_tokens_mean": training_mean("rollout/response_tokens_mean")},
        cell=lambda row: f"{row['response_tokens_mean']:.1f}"))

docs/adding_a_report_column.md walks through one. The built-in columns here (the environment, the
pipeline, the rollout-training mismatch) are declared the same way; the accuracy and budget columns
every table carries are fixed in analysis/render.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from harness.core.registry import Registry

log = logging.getLogger(__name__)
AGGREGATES = ("mean", "median", "max", "min")


@dataclass
class RunRecord:
    """One finished run as the readers see it: its files, parsed (analysis/collect.py builds it)."""

    path: str
    info: dict  # run.json
    config: dict  # config.yaml, nested
    flat: dict  # config.yaml as dotted keys
    algo: str
    task: str
    eval_metric: str  # the metrics key of the run's eval accuracy (``eval/<task>/accuracy``)
    metrics: pd.DataFrame  # metrics.jsonl, one row per step (step 0: the start's eval), ``eval_acc`` its eval metric
    train: pd.DataFrame = field(init=False)  # the training steps (step > 0)
    evals: pd.DataFrame = field(init=False)  # the steps with an eval line (``eval_acc`` set)

    def __post_init__(self) -> None:
        self.train = self.metrics[self.metrics["step"] > 0]
        self.evals = self.metrics[self.metrics["eval_acc"].notna()]


Reader = Callable[[RunRecord], float]


@dataclass(frozen=True)
class Column:
    """One report column.

    ``values``: CSV column name -> the reader of one run's value (NaN where the run has none); a row's
    value is the ``aggregate`` of its seeds' values that are not NaN. ``cell``: the table cell from a
    row (a mapping holding ``values``' names and the row's identity columns). ``shown``: whether a
    table shows the column at all (default: some row has a value)."""

    header: str
    values: dict[str, Reader]
    cell: Callable[[Mapping[str, Any]], str]
    shown: Callable[[pd.DataFrame], bool] | None = None
    aggregate: str = "mean"

    def __post_init__(self) -> None:
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"Column {self.header!r}: aggregate={self.aggregate!r}; one of {', '.join(AGGREGATES)}")
        if not self.values:
            raise ValueError(f"Column {self.header!r}: values is empty; name at least one value and its reader")

    def is_shown(self, rows: pd.DataFrame) -> bool:
        if self.shown is not None:
            return bool(self.shown(rows))
        return any(name in rows and rows[name].notna().any() for name in self.values)

    def combine(self, seeds: pd.Series) -> float:
        """A row's value from its runs' values (NaN when none has one)."""
        seeds = seeds.astype(float).dropna()
        return float(getattr(seeds, self.aggregate)()) if len(seeds) else float("nan")


REPORT_COLUMNS: Registry[Column] = Registry(
    "report column", entry_point_group="harness.report_columns", owner=lambda column: column.cell,
    how_to_add="register one with analysis.columns.register_column(NAME, Column(...)) in your module and pass "
               "`harness report --plugins MODULE` (docs/adding_a_report_column.md)")  # fmt: skip
BUILTIN_ORDER: list[str] = []  # the built-ins' order in a table; a plugin's columns follow, by name


def register_column(name: str, column: Column) -> Column:
    """Add ``column`` to every report under ``name`` (a name has one owner)."""
    if not isinstance(column, Column):
        raise TypeError(f"register_column({name!r}, ...): a Column, not {type(column).__name__}")
    return REPORT_COLUMNS.add(name, column)


def columns() -> list[Column]:
    """The registered columns in table order: the built-ins, then the others by name."""
    entries = REPORT_COLUMNS.entries()
    return [entries[n] for n in BUILTIN_ORDER] + [c for n, c in entries.items() if n not in BUILTIN_ORDER]


def read_values(record: RunRecord) -> dict[str, float]:
    """Every registered column's values for one run (what analysis/collect.py adds to its row). A reader that fails
    (a plugin's bug, a run without what it expects) gives NaN for that value and a logged warning naming it."""
    out = {}
    for column in columns():
        for name, reader in column.values.items():
            try:
                out[name] = float(reader(record))
            except Exception as exc:  # one bad reader must not lose the run's other columns or the report
                log.warning("report column %r: value %r failed on %s (%s: %s); it is left empty for this run",
                            column.header, name, record.path, type(exc).__name__, exc)  # fmt: skip
                out[name] = float("nan")
    return out


# ----------------------------------------------------------------------------- readers
def training_mean(key: str, missing: float = float("nan")) -> Reader:
    """The mean of metric ``key`` over the training steps (``missing`` where the run never logged it)."""

    def read(run: RunRecord) -> float:
        col = run.train[key] if key in run.train.columns else None
        return float(col.mean()) if col is not None and col.notna().any() else missing

    return read


def final_eval(key: str) -> Reader:
    """Metric ``eval/<task>/<key>`` at the run's last eval (NaN where it has none)."""

    def read(run: RunRecord) -> float:
        value = run.evals.iloc[-1].get(f"eval/{run.task}/{key}", float("nan"))
        return float(value) if value is not None else float("nan")

    return read


def is_nan(x: Any) -> bool:
    """None or a float NaN: a value a run or row does not have (shared with analysis/render.py)."""
    return x is None or (isinstance(x, float) and np.isnan(x))


# ----------------------------------------------------------------------------- built-in columns
def _builtin(name: str, column: Column) -> None:
    register_column(name, column)
    BUILTIN_ORDER.append(name)


def _env_cell(r: Mapping[str, Any]) -> str:
    """``none``, or the environment with the final eval's tool-success fraction and turns per episode."""
    if r.get("env", "none") == "none" or is_nan(r.get("tool_success_final", float("nan"))):
        return str(r.get("env", "none"))
    return f"{r['env']} ({r['tool_success_final']:.2f}, {r['turns_final']:.1f})"


def _pipeline_cell(r: Mapping[str, Any]) -> str:
    """``sync``, or the pipeline with the mean staleness of the batches trained on."""
    label = str(r.get("pipeline", "sync"))
    stale = r.get("staleness_mean", 0.0)
    return label if label == "sync" or is_nan(stale) else f"{label}; staleness {stale:.2f}"


def _mismatch_cell(r: Mapping[str, Any]) -> str:
    """Mean log-prob gap per token, ESS of the sequence ratios, token fraction a correction dropped (``-``: none logged)."""
    gap, ess, rejected = (r.get(k, float("nan")) for k in ("logp_gap_mean", "mismatch_ess", "rejected_frac"))
    if is_nan(gap):
        return "-"
    parts = [f"gap {gap:.4f}"] + ([f"ESS {ess:.3f}"] if not is_nan(ess) else [])
    return ", ".join(parts + ([f"rejected {rejected:.3f}"] if not is_nan(rejected) else []))


# Multi-turn episodes (env.name): at the final eval, the fraction of episodes with a successful tool call and the model
# turns per episode (NaN for single-turn runs).
_builtin("env", Column(
    header="env (final tool success, turns)",
    values={"tool_success_final": final_eval("tool_success_frac"), "turns_final": final_eval("turns_mean")},
    cell=_env_cell, shown=lambda rows: "env" in rows and bool((rows["env"] != "none").any())))
# Rollout ahead of training (trainer.pipeline): how stale the trained batches were on average (0 for a sync run).
_builtin("pipeline", Column(
    header="pipeline", values={"staleness_mean": training_mean("rollout/staleness_mean", missing=0.0)},
    cell=_pipeline_cell, shown=lambda rows: "pipeline" in rows and bool((rows["pipeline"] != "sync").any())))
# Rollout-training mismatch, where the rollout's log-probs reached the trainer (NaN elsewhere): the mean log-prob gap per
# token, the normalised ESS of the sequence ratios, and the token fraction a correction dropped.
_builtin("mismatch", Column(
    header="mismatch (gap/token, ESS, rejected tokens)",
    values={"logp_gap_mean": training_mean("rollout/logp_gap_mean"), "mismatch_ess": training_mean("mismatch/ess"),
            "rejected_frac": training_mean("rollout/correction_dropped_frac")},
    cell=_mismatch_cell, shown=lambda rows: "logp_gap_mean" in rows and bool(rows["logp_gap_mean"].notna().any())))
