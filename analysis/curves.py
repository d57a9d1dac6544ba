"""Compute-fitted learning curves: the ceiling A and the efficiency B of each run (ScaleRL).

Khatri et al. 2025, "The Art of Scaling Reinforcement Learning Compute for LLMs" (ScaleRL,
arXiv 2510.13786), fit pass rate against RL compute C with a sigmoid

    R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)

where R0 is the start's accuracy, A the asymptote (the ceiling the recipe approaches), B the
steepness (how efficiently compute buys accuracy) and C_mid the compute at half the gain. They
find recipes differ mostly in efficiency, not in ceiling, so a comparison at one budget can
mislead. Here compute is the run's generated tokens (``budget/generated_tokens``) or, with
``--fit-compute wall``, its training wall seconds; R0 is the run's own eval at compute 0.

Our fit (own implementation, scipy's bounded least squares): A in [0, 1] (an accuracy),
B in [B_MIN, B_MAX], log C_mid within two decades of the measured compute range, the best of
a fixed grid of starts (deterministic). A run gets NaN and a note instead of numbers when:
  - it has fewer than MIN_POINTS evals after the start (3 free parameters need 4 points to
    leave a residual; the main job's 3 evals cannot carry a fit);
  - its curve is flat (no eval moves more than FLAT_TOL from R0: nothing to fit);
  - the start (compute 0) was not evaluated (R0 unknown);
  - the curve has not bent within the budget (the midpoint at its bound, or A at 0 or 1 with
    the midpoint past the last eval): these points identify a slope, not A and B.
A run whose gain came before its first eval after the start (the midpoint earlier, or B at a bound)
keeps A, its plateau, with B and C_mid NaN and a note: its points do not show the rise's shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_POINTS = 4  # evals after the start
FLAT_TOL = 0.02  # accuracy; about one binomial standard error of a 512-prompt eval near 0.5
B_MIN, B_MAX = 0.1, 10.0
MID_DECADES = 2.0  # C_mid may lie this many decades below the first / above the last measured compute
COMPUTE_COLUMNS = {"tokens": "budget/generated_tokens", "wall": "budget/wall_s"}
COMPUTE_LABELS = {"tokens": "generated tokens (training)", "wall": "training wall time (s)"}


@dataclass
class CurveFit:
    A: float = math.nan  # ceiling (asymptotic accuracy)
    B: float = math.nan  # efficiency (steepness in log compute)
    c_mid: float = math.nan  # compute at half the gain, in the compute's unit
    r0: float = math.nan  # the start's accuracy (not fitted)
    rmse: float = math.nan
    points: int = 0  # evals after the start
    note: str = ""  # why there are no numbers ('' when fitted)

    @property
    def ok(self) -> bool:
        """Both A and B identified."""
        return not self.note


def curve(c, r0: float, A: float, B: float, c_mid: float) -> np.ndarray:
    """R(C) of ScaleRL's sigmoid; R(0) = r0."""
    c = np.asarray(c, float)
    with np.errstate(divide="ignore", over="ignore"):
        frac = 1.0 / (1.0 + (c_mid / np.where(c > 0, c, np.nan)) ** B)
    return r0 + (A - r0) * np.nan_to_num(frac, nan=0.0)


def fit_curve(compute, accuracy) -> CurveFit:
    """Fit A, B, C_mid to one run's (compute, eval accuracy) points; R0 is the point at compute 0."""
    from scipy.optimize import least_squares

    c, y = np.asarray(compute, float), np.asarray(accuracy, float)
    ok = ~(np.isnan(c) | np.isnan(y))
    c, y = c[ok], y[ok]
    start = c <= 0
    after = ~start
    n = int(after.sum())
    if not start.any():
        return CurveFit(points=n, note="no eval at compute 0: the start's accuracy R0 is unknown")
    r0 = float(y[start][0])
    c, y = c[after], y[after]
    if n < MIN_POINTS:
        return CurveFit(r0=r0, points=n, note=f"too few evals to fit ({n} after the start; A, B, C_mid need {MIN_POINTS})")
    if float(np.max(np.abs(y - r0))) < FLAT_TOL:
        return CurveFit(r0=r0, points=n, note=f"flat: no eval moves {FLAT_TOL} from the start ({r0:.3f})")
    lo_mid, hi_mid = math.log(c.min()) - MID_DECADES * math.log(10), math.log(c.max()) + MID_DECADES * math.log(10)

    def residuals(p):
        return curve(c, r0, p[0], p[1], math.exp(p[2])) - y

    best = None
    gain = y[-1] - r0
    for a0 in (min(max(r0 + 1.2 * gain, 0.0), 1.0), float(y.max()), float(y.min())):
        for b0 in (0.5, 1.5, 4.0):
            for m0 in (math.log(np.median(c)), math.log(c.min()), math.log(c.max())):
                x0 = np.clip([a0, b0, m0], [0.0, B_MIN, lo_mid], [1.0, B_MAX, hi_mid])
                res = least_squares(residuals, x0, bounds=([0.0, B_MIN, lo_mid], [1.0, B_MAX, hi_mid]), method="trf")
                if best is None or res.cost < best.cost - 1e-15:
                    best = res
    A, B, log_mid = (float(v) for v in best.x)
    rmse = float(np.sqrt(np.mean(best.fun**2)))
    out = CurveFit(A=A, B=B, c_mid=math.exp(log_mid), r0=r0, rmse=rmse, points=n)
    at_bound = hi_mid - log_mid < 1e-3 or (min(A, 1.0 - A) < 1e-3 and out.c_mid > c.max())
    if at_bound:  # the sigmoid's bend lies beyond the measured points: only the slope is known
        return CurveFit(r0=r0, rmse=rmse, points=n, note="the curve has not bent within the budget (its midpoint lies "
                                                         "past the last eval): A and B not identified")
    if out.c_mid < c.min() or B >= B_MAX * (1 - 1e-3) or B <= B_MIN * (1 + 1e-3):
        # the rise happened before the first eval after the start: its plateau (A) is measured, its shape is not
        return CurveFit(A=A, r0=r0, rmse=rmse, points=n, note="most of the gain came before the first eval: A is its "
                                                               "plateau; B and C_mid not identified (evaluate earlier)")
    return out


def fit_runs(runs: pd.DataFrame, metrics: pd.DataFrame, compute: str = "tokens") -> pd.DataFrame:
    """One fit per run: columns run_dir, fit_A, fit_B, fit_c_mid, fit_r0, fit_rmse, fit_points, fit_note."""
    if compute not in COMPUTE_COLUMNS:
        raise ValueError(f"compute {compute!r}: use {' or '.join(COMPUTE_COLUMNS)}")
    col = COMPUTE_COLUMNS[compute]
    rows = []
    for d in runs["run_dir"]:
        ev = metrics[(metrics["run_dir"] == d) & metrics["eval_acc"].notna()].sort_values("step")
        x = ev[col].to_numpy(float, copy=True) if col in ev else np.full(len(ev), np.nan)
        if len(ev) and ev["step"].iloc[0] == 0:
            x[0] = 0.0  # the start eval costs nothing
        f = fit_curve(x, ev["eval_acc"].to_numpy(float))
        rows.append({"run_dir": d, "fit_A": f.A, "fit_B": f.B, "fit_c_mid": f.c_mid, "fit_r0": f.r0,
                     "fit_rmse": f.rmse, "fit_points": f.points, "fit_note": f.note})
    return pd.DataFrame(rows, columns=["run_dir", "fit_A", "fit_B", "fit_c_mid", "fit_r0", "fit_rmse", "fit_points",
                                       "fit_note"])


# ----------------------------------------------------------------------------- per arm: mean over seeds, Δ to baseline
@dataclass
class FitTable:
    task: str
    compute: str  # tokens | wall
    rows: pd.DataFrame  # one row per setting of the task's summary table
    baseline: str | None = None


def _arm_label(r) -> str:
    return r["algo"] + (f" [{r['variant']}]" if r.get("variant") else "")


def fit_tables(tables, fits: pd.DataFrame, baseline: str | None, compute: str = "tokens") -> list[FitTable]:
    """Per task and setting (the rows of analysis.tables.build_tables): A and B as mean over the fitted seeds
    with a bootstrap 95% CI; with a baseline, their differences to the row the accuracy column compares with
    (Welch's t-test over seeds, 95% CI, p Holm-corrected over the rows, per quantity)."""
    from analysis.stats import bootstrap_ci, holm, mean_std, welch

    by_run = fits.set_index("run_dir")
    out = []
    for t in tables:
        rows = []
        per_row: dict[int, dict[str, np.ndarray]] = {}
        for i, r in t.rows.iterrows():
            f = by_run.loc[[d for d in r["run_dirs"] if d in by_run.index]]
            row = {"task": t.task, "setting": _arm_label(r), "algo": r["algo"], "variant": r.get("variant", ""),
                   "runs": len(f), "fitted": int(f["fit_A"].notna().sum()), "fitted_B": int(f["fit_B"].notna().sum()),
                   "r0_mean": float(f["fit_r0"].mean())}
            per_row[i] = {}
            for q in ("A", "B", "c_mid"):
                v = f[f"fit_{q}"].dropna().to_numpy(float)  # each quantity over the runs that identify it
                per_row[i][q] = v
                m, s = mean_std(v)
                lo, hi = bootstrap_ci(v)
                row |= {f"{q}_mean": m, f"{q}_std": s, f"{q}_ci_lo": lo, f"{q}_ci_hi": hi}
            reasons = f.loc[f["fit_note"] != "", "fit_note"].value_counts()
            row["notes"] = "; ".join(f"{n} run(s): {why}" for why, n in reasons.items())
            row["is_baseline"] = bool(r.get("is_baseline", False))
            rows.append(row)
        df = pd.DataFrame(rows, index=t.rows.index)
        for q in ("A", "B"):
            for col in (f"d{q}", f"d{q}_ci_lo", f"d{q}_ci_hi", f"p{q}", f"p{q}_holm"):
                df[col] = np.nan
            if baseline is None or "baseline_row" not in t.rows:
                continue
            for i, b in t.rows["baseline_row"].items():
                if pd.isna(b) or df.at[i, "is_baseline"]:
                    continue
                mine, theirs = per_row[i][q], per_row[int(b)][q]
                if len(mine) == 0 or len(theirs) == 0:
                    continue
                p, lo, hi = welch(mine, theirs)
                df.at[i, f"d{q}"] = float(mine.mean() - theirs.mean())
                df.at[i, f"d{q}_ci_lo"], df.at[i, f"d{q}_ci_hi"], df.at[i, f"p{q}"] = lo, hi, p
            df[f"p{q}_holm"] = holm(df[f"p{q}"].to_numpy(float))
        out.append(FitTable(task=t.task, compute=compute, rows=df.reset_index(drop=True), baseline=baseline))
    return out


def _num(x: float, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _stat(r, q: str) -> str:
    if math.isnan(r[f"{q}_mean"]):
        return "-"
    if r["fitted" if q == "A" else "fitted_B"] == 1:
        return f"{r[f'{q}_mean']:.3f} (1 seed)"
    return f"{r[f'{q}_mean']:.3f} [{r[f'{q}_ci_lo']:.3f}, {r[f'{q}_ci_hi']:.3f}]"


def _delta(r, q: str) -> list[str]:
    if r["is_baseline"]:
        return ["baseline", ""]
    d = r[f"d{q}"]
    if math.isnan(d):
        return ["-", "-"]
    ci = "" if math.isnan(r[f"d{q}_ci_lo"]) else f" [{r[f'd{q}_ci_lo']:+.3f}, {r[f'd{q}_ci_hi']:+.3f}]"
    p = "-" if math.isnan(r[f"p{q}"]) else f"{r[f'p{q}']:.2g} ({r[f'p{q}_holm']:.2g})"
    return [f"{d:+.3f}{ci}", p]


def fit_display(ft: FitTable) -> tuple[list[str], list[list[str]]]:
    unit = "tokens" if ft.compute == "tokens" else "s"
    headers = ["algo", "runs fitted (A, B)", "R0", "A (ceiling) [95% CI]", "B (efficiency) [95% CI]", f"C_mid ({unit})"]
    has_delta = ft.baseline is not None and bool(ft.rows["is_baseline"].any())
    if has_delta:
        headers += [f"ΔA vs {ft.baseline} [95% CI]", "p A (Holm)", f"ΔB vs {ft.baseline} [95% CI]", "p B (Holm)"]
    headers.append("no fit")
    from analysis.render import fmt_count

    cells = []
    for _, r in ft.rows.iterrows():
        row = [r["setting"], f"{r['fitted']}, {r['fitted_B']} of {r['runs']}", _num(r["r0_mean"]), _stat(r, "A"), _stat(r, "B"),
               fmt_count(r["c_mid_mean"]) if unit == "tokens" else _num(r["c_mid_mean"], 0)]
        if has_delta:
            row += _delta(r, "A") + _delta(r, "B")
        row.append(r["notes"] or "")
        cells.append(row)
    return headers, cells


def fit_notes(ft: FitTable) -> list[str]:
    out = [f"compute fit (ScaleRL, arXiv 2510.13786): R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) per run, C = "
           f"{COMPUTE_LABELS[ft.compute]}, R0 the start's eval; A, B: mean over the seeds that identify each [95% "
           f"bootstrap CI]; a run needs {MIN_POINTS} evals after the start and a curve that moves and bends, and B also "
           f"a rise seen between evals (else 'no fit' says why)"]
    if ft.baseline is not None and ft.rows["is_baseline"].any():
        out.append("ΔA, ΔB: difference of the means to the row the accuracy Δ compares with; Welch's two-sided t-test "
                   "over fitted seeds, 95% CI; p Holm-corrected over the rows, per quantity")
    return out


def fit_markdown(fts: list[FitTable]) -> str:
    from analysis.render import _md_escape

    out = []
    for ft in fts:
        headers, cells = fit_display(ft)
        out += [f"## task {ft.task}: compute-fitted curves", ""]
        out.append("| " + " | ".join(_md_escape(h) for h in headers) + " |")
        out.append("|" + "|".join("---" for _ in headers) + "|")
        out += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in cells]
        out.append("")
        out += [f"- {n}" for n in fit_notes(ft)]
        out.append("")
    return "\n".join(out)


def fit_console(fts: list[FitTable], console) -> None:
    from rich.markup import escape
    from rich.table import Table

    for ft in fts:
        headers, cells = fit_display(ft)
        rt = Table(title=f"task {ft.task}: compute-fitted curves", title_justify="left", header_style="bold")
        for h in headers:
            rt.add_column(h, overflow="fold")
        for row in cells:
            rt.add_row(*[escape(c) for c in row])
        console.print(rt)
        for n in fit_notes(ft):
            console.print(f"  [dim]{escape(n)}[/]", highlight=False)


FIT_CSV_COLUMNS = ["task", "setting", "algo", "variant", "runs", "fitted", "fitted_B", "r0_mean",
                   *[f"{q}_{s}" for q in ("A", "B", "c_mid") for s in ("mean", "std", "ci_lo", "ci_hi")],
                   *[f"{p}{q}{s}" for q in ("A", "B") for p, s in (("d", ""), ("d", "_ci_lo"), ("d", "_ci_hi"),
                                                                  ("p", ""), ("p", "_holm"))],
                   "is_baseline", "notes"]


def fit_csv(fts: list[FitTable], per_run: pd.DataFrame, runs: pd.DataFrame) -> tuple[str, str]:
    """(per-setting CSV, per-run CSV) of the fits."""
    df = pd.concat([ft.rows for ft in fts], ignore_index=True).reindex(columns=FIT_CSV_COLUMNS)
    ident = runs[["run_dir", "task", "algo", "variant", "seed"]].merge(per_run, on="run_dir")
    return df.to_csv(index=False, float_format="%.6g"), ident.to_csv(index=False, float_format="%.6g")


def plot_fits(runs: pd.DataFrame, metrics: pd.DataFrame, fits: pd.DataFrame, out_dir, compute: str = "tokens") -> list:
    """plots/fit_<task>.png|pdf: every run's measured evals (dots) and its fitted curve (line), one colour per setting."""
    from pathlib import Path

    import matplotlib.pyplot as plt

    from analysis.plots import _save, _settings, algo_color

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    col = COMPUTE_COLUMNS[compute]
    labels = dict(zip(runs["run_dir"], _settings(runs)))
    by_run = fits.set_index("run_dir")
    paths = []
    for task, truns in runs.groupby("task"):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        settings = sorted({labels[d] for d in truns["run_dir"]})
        colours = {s: algo_color(s) for s in settings}
        xmax = 0.0
        for d in truns["run_dir"]:
            ev = metrics[(metrics["run_dir"] == d) & metrics["eval_acc"].notna()].sort_values("step")
            x = ev[col].to_numpy(float, copy=True)
            x[ev["step"].to_numpy() == 0] = 0.0
            xmax = max(xmax, float(np.nanmax(x)) if len(x) else 0.0)
            ax.scatter(x, ev["eval_acc"], s=12, color=colours[labels[d]], alpha=0.6)
            f = by_run.loc[d]
            if not math.isnan(f["fit_B"]):
                grid = np.linspace(0, x.max(), 200)
                ax.plot(grid, curve(grid, f["fit_r0"], f["fit_A"], f["fit_B"], f["fit_c_mid"]),
                        color=colours[labels[d]], lw=1, alpha=0.8)
        for s in settings:
            ax.plot([], [], color=colours[s], label=s)
        ax.set(xlabel=COMPUTE_LABELS[compute], ylabel="eval accuracy",
               title=f"{task}: fitted R(C) = R0 + (A - R0) / (1 + (C_mid/C)^B)")
        ax.legend(fontsize=7, loc="lower right")
        paths += _save(fig, out, f"fit_{task}")
    return paths
