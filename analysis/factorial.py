"""Factorial designs in ``harness report``: main effects with CIs and Holm p, and an interaction test.

When the runs of a task cross two or more factors (config keys: ``algo.name`` x ``trainer.lr``, or an
algorithm's parts), each with two or more levels, and every combination of levels has runs, the report
adds a main-effects table: for each factor, each level's effect on the final eval accuracy against the
factor's reference level, averaged with equal weight over the cells of the other factors (the
"main effect" of a two-way ANOVA with sum-to-zero coding of the others; Montgomery, *Design and
Analysis of Experiments*, ch. 5). Seeds are the replicates of a cell.

For a level l against the reference r of factor F, with G the cells of the other factors:

    effect = (1/G) sum_g (mean_{l,g} - mean_{r,g})
    SE^2   = s^2 / G^2 * sum_g (1/n_{l,g} + 1/n_{r,g})

s^2 the pooled within-cell variance on N - C degrees of freedom (N runs, C cells); a two-sided t-test
on those degrees of freedom gives p and the 95% CI, Holm-corrected over every contrast of the table.
The interaction test compares the additive model (main effects only) with the cell-means model by
an F-test: F = ((RSS_add - RSS_cells) / (C - 1 - sum_F (L_F - 1))) / (RSS_cells / (N - C)).

A design that is not full (a missing cell, a single level, a single run per cell, so no pooled
variance) gets a note that says so, not numbers.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats import ALPHA, POWER, holm

OUTCOME = "eval_final"
# Keys that are never factors: identity, bookkeeping, and how a run was launched.
NOT_FACTORS = ("seed", "run_dir", "hydra", "logging", "runtime", "plugins", "samples", "eval_limit")


@dataclass
class MainEffect:
    factor: str
    level: str
    reference: str
    effect: float
    ci: tuple[float, float]
    p: float
    p_holm: float = float("nan")
    mde: float = float("nan")
    n_cells: int = 0  # cells of the other factors the effect averages over


@dataclass
class Factorial:
    """A task's factorial analysis: ``effects`` when the design is full, else ``note`` says why not."""

    task: str
    factors: list[str]
    levels: dict[str, list[str]] = field(default_factory=dict)
    effects: list[MainEffect] = field(default_factory=list)
    interaction: tuple[float, float, int, int] | None = None  # (F, p, df1, df2); None with no df left
    n_runs: int = 0
    cell_runs: tuple[int, int] = (0, 0)  # fewest and most runs in a cell
    residual_df: int = 0
    note: str = ""


def _fmt(value: Any) -> str:
    """A level as the config wrote it (lists as a,b)."""
    if isinstance(value, (list, tuple)):
        return ",".join(_fmt(v) for v in value)
    return str(value)


def _candidate(key: str) -> bool:
    return key.split(".")[0] not in NOT_FACTORS


def detect_factors(configs: list[dict[str, Any]]) -> list[str]:
    """The config keys that vary over these runs, less those another varying key determines.

    A key set by another (``algo.clip_high`` differs between algorithms because it is DAPO's default)
    is not a factor of its own; of two keys that determine each other the shorter name stays."""
    keys = sorted(set.intersection(*(set(c) for c in configs))) if configs else []
    values = {k: [_fmt(c[k]) for c in configs] for k in keys if _candidate(k)}
    varying = {k: v for k, v in values.items() if len(set(v)) > 1}

    def determines(a: str, b: str) -> bool:  # b is a function of a over these runs
        seen: dict[str, str] = {}
        return all(seen.setdefault(x, y) == y for x, y in zip(varying[a], varying[b]))

    order = sorted(varying, key=lambda k: (len(k), k))
    kept: list[str] = []
    for k in order:
        if not any(determines(j, k) for j in varying if j != k and (not determines(k, j) or j in kept)):
            kept.append(k)
    return kept


def analyse(task: str, runs: pd.DataFrame, configs: dict[str, dict[str, Any]], factors: list[str] | None = None,
            references: dict[str, str] | None = None) -> Factorial | None:
    """The factorial analysis of one task's runs over ``factors`` (config keys). Without them, over the
    keys that vary (``detect_factors``), and None unless those form a full factorial with replicates: an
    ordinary sweep (algorithms and a control arm) is not asked for one and gets no note."""
    cfgs = [configs.get(d, {}) for d in runs["run_dir"]]
    if factors is None:
        factors = detect_factors(cfgs)
        if len(factors) < 2:
            return None
        found = analyse(task, runs, configs, factors, references)
        return found if found is not None and not found.note else None
    missing = [f for f in factors if any(f not in c for c in cfgs)]
    if missing:
        return Factorial(task, factors, note=f"not every run sets {', '.join(missing)}: no factorial analysis")
    frame = pd.DataFrame({f: [_fmt(c[f]) for c in cfgs] for f in factors})
    frame["y"] = runs[OUTCOME].to_numpy(float)
    frame = frame[~frame["y"].isna()]
    levels = {f: sorted(frame[f].unique(), key=_level_key) for f in factors}
    out = Factorial(task, factors, levels, n_runs=len(frame))
    for f, ref in (references or {}).items():
        if f in levels and ref not in levels[f]:
            out.note = f"reference {f}={ref}: no runs at that level (levels: {', '.join(levels[f])})"
            return out
    single = [f for f in factors if len(levels[f]) < 2]
    if single:
        out.note = f"{', '.join(single)} has a single level: not a factorial design"
        return out
    cells = frame.groupby(factors, sort=True)["y"]
    counts = cells.size()
    full = list(itertools.product(*(levels[f] for f in factors)))
    absent = [c for c in full if c not in counts.index]
    if absent:
        shown = "; ".join(" ".join(f"{f}={v}" for f, v in zip(factors, c)) for c in absent[:3])
        out.note = (f"not a full factorial: {len(absent)} of {len(full)} cells have no runs ({shown}"
                    f"{'; ...' if len(absent) > 3 else ''}): no main effects")
        return out
    out.cell_runs = (int(counts.min()), int(counts.max()))
    out.residual_df = len(frame) - len(full)
    if out.residual_df < 1:
        out.note = "one run per cell: no within-cell variance to test against (run more seeds)"
        return out
    means = cells.mean()
    rss_cells = float(((frame["y"] - frame.groupby(factors)["y"].transform("mean")) ** 2).sum())
    s2 = rss_cells / out.residual_df
    out.effects = _main_effects(factors, levels, means, counts, s2, out.residual_df, references or {})
    for e, p in zip(out.effects, holm([e.p for e in out.effects])):
        e.p_holm = float(p)
    out.interaction = _interaction(frame, factors, levels, rss_cells, out.residual_df)
    return out


def _level_key(v: str):
    try:
        return (0, float(v), v)
    except ValueError:
        return (1, 0.0, v)


def _main_effects(factors, levels, means, counts, s2, df, references) -> list[MainEffect]:
    from scipy import stats

    t_crit = float(stats.t.ppf(1 - ALPHA / 2, df))
    t_power = float(stats.t.ppf(POWER, df))
    effects = []
    for i, f in enumerate(factors):
        others = [levels[g] for g in factors if g != f]
        ref = references.get(f, levels[f][0])

        def cell(level, rest, i=i):
            key = tuple([*rest[:i], level, *rest[i:]])
            return float(means.loc[key]), int(counts.loc[key])

        for level in levels[f]:
            if level == ref:
                continue
            diffs, var_terms = [], []
            for rest in itertools.product(*others):
                (ml, nl), (mr, nr) = cell(level, list(rest)), cell(ref, list(rest))
                diffs.append(ml - mr)
                var_terms.append(1 / nl + 1 / nr)
            g = len(diffs)
            effect = sum(diffs) / g
            se = math.sqrt(s2 * sum(var_terms)) / g
            if se > 0:
                p = float(2 * stats.t.sf(abs(effect / se), df))
                ci = (effect - t_crit * se, effect + t_crit * se)
            else:
                p, ci = float("nan"), (float("nan"), float("nan"))
            effects.append(MainEffect(f, level, ref, effect, ci, p, mde=(t_crit + t_power) * se, n_cells=g))
    return effects


def _interaction(frame, factors, levels, rss_cells, df_cells) -> tuple[float, float, int, int] | None:
    """F-test of the additive model against the cell-means model (all interactions at once)."""
    from scipy import stats

    cols = [np.ones(len(frame))]
    for f in factors:
        cols += [(frame[f] == lv).to_numpy(float) for lv in levels[f][1:]]
    x = np.column_stack(cols)
    beta, *_ = np.linalg.lstsq(x, frame["y"].to_numpy(float), rcond=None)
    rss_add = float(((frame["y"].to_numpy(float) - x @ beta) ** 2).sum())
    n_cells = math.prod(len(levels[f]) for f in factors)
    df1 = n_cells - 1 - sum(len(levels[f]) - 1 for f in factors)
    if df1 < 1 or rss_cells <= 0:
        return None
    f_stat = ((rss_add - rss_cells) / df1) / (rss_cells / df_cells)
    return float(f_stat), float(stats.f.sf(f_stat, df1, df_cells)), df1, df_cells


def verdict(fa: Factorial, factor: str) -> str:
    """One line per factor: whether any of its levels moves the outcome at Holm p < 0.05."""
    rows = [e for e in fa.effects if e.factor == factor]
    hits = [e for e in rows if e.p_holm < ALPHA]
    if hits:
        return "matters: " + ", ".join(f"{e.level} {e.effect:+.3f} (Holm p {e.p_holm:.2g})" for e in hits)
    largest = max((e.mde for e in rows), default=float("nan"))
    return f"no level differs from {rows[0].reference if rows else '?'} at Holm p < 0.05 (MDE up to {largest:.3f})"


def markdown(fas: list[Factorial]) -> str:
    """The main-effects section of report.md (and the console's text)."""
    out = ["## Main effects (factorial design)", ""]
    for fa in fas:
        out.append(f"**{fa.task}**: factors {' x '.join(f'{f} ({len(fa.levels.get(f, []))})' for f in fa.factors)}, "
                   f"{fa.n_runs} runs" + (f", {_span(fa.cell_runs)} per cell" if fa.effects else ""))
        out.append("")
        if fa.note:
            out += [f"{fa.note}.", ""]
            continue
        out.append("| factor | level | vs | effect on final accuracy [95% CI] | p | p (Holm) | MDE |")
        out.append("|---|---|---|---|---|---|---|")
        for e in fa.effects:
            out.append(f"| {e.factor} | {e.level} | {e.reference} | {e.effect:+.4f} [{e.ci[0]:+.4f}, {e.ci[1]:+.4f}] "
                       f"| {e.p:.2g} | {e.p_holm:.2g} | {e.mde:.4f} |")
        out.append("")
        if fa.interaction is None:
            out.append("Interaction: not testable (no degrees of freedom left).")
        else:
            f_stat, p, df1, df2 = fa.interaction
            out.append(f"Interaction (additive model vs cell means): F({df1}, {df2}) = {f_stat:.3g}, p = {p:.2g}"
                       + (": the factors interact, so read each main effect with the cells in mind." if p < ALPHA else "."))
        out.append("")
        for f in fa.factors:
            out.append(f"- **{f}**: {verdict(fa, f)}")
        out.append("")
    out.append(f"Effect: the level's mean final eval accuracy minus the reference level's, averaged over the cells of "
               f"the other factors; pooled within-cell variance, t-test on N - cells degrees of freedom; Holm over "
               f"the table's contrasts; MDE at alpha {ALPHA}, power {POWER}.")
    return "\n".join(out) + "\n"


def _span(lo_hi: tuple[int, int]) -> str:
    return str(lo_hi[0]) if lo_hi[0] == lo_hi[1] else f"{lo_hi[0]}-{lo_hi[1]}"


def csv_frame(fas: list[Factorial]) -> pd.DataFrame:
    rows = [{"task": fa.task, "factor": e.factor, "level": e.level, "reference": e.reference, "effect": e.effect,
             "ci_lo": e.ci[0], "ci_hi": e.ci[1], "p": e.p, "p_holm": e.p_holm, "mde": e.mde, "cells": e.n_cells,
             "interaction_p": fa.interaction[1] if fa.interaction else float("nan")}
            for fa in fas for e in fa.effects]  # fmt: skip
    return pd.DataFrame(rows)
