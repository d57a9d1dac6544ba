"""Compute-fitted curves (analysis/curves.py, ScaleRL arXiv 2510.13786): the fit recovers known parameters,
bad curves get a note instead of a number, and `harness report` prints and writes A and B per setting with
their differences to the baseline."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest
from fake_runs import make_run
from rich.console import Console

from analysis import report
from analysis.curves import MIN_POINTS, curve, fit_curve

TOKENS = np.array([0, 10e3, 25e3, 50e3, 75e3, 100e3, 150e3, 200e3])


@pytest.mark.parametrize("A,B,c_mid", [(0.55, 1.5, 40e3), (0.8, 0.8, 100e3), (0.3, 3.0, 20e3), (0.15, 2.0, 60e3)])
def test_the_fit_recovers_known_parameters(A, B, c_mid):
    f = fit_curve(TOKENS, curve(TOKENS, 0.33, A, B, c_mid))
    assert f.ok and f.points == len(TOKENS) - 1 and f.r0 == 0.33
    assert f.A == pytest.approx(A, abs=1e-4) and f.B == pytest.approx(B, rel=1e-3)
    assert f.c_mid == pytest.approx(c_mid, rel=1e-3)


def test_the_fit_holds_under_eval_noise():
    """Binomial noise of a 512-prompt eval (sd ~0.02) on 20 copies: A within 0.03, B within 40% (medians); a copy
    whose noise straightens the curve may get 'not bent' instead of numbers (1 of the 20 here)."""
    rng = np.random.default_rng(0)
    clean = curve(TOKENS, 0.33, 0.55, 1.5, 40e3)
    fits = [fit_curve(TOKENS, np.r_[0.33, clean[1:] + rng.normal(0, 0.02, len(TOKENS) - 1)]) for _ in range(20)]
    fits = [f for f in fits if f.ok]
    assert len(fits) >= 18
    assert np.median([f.A for f in fits]) == pytest.approx(0.55, abs=0.03)
    assert np.median([f.B for f in fits]) == pytest.approx(1.5, rel=0.4)


def test_the_curve_starts_at_r0_and_reaches_half_the_gain_at_c_mid():
    assert curve([0.0], 0.2, 0.6, 2.0, 1e4)[0] == 0.2
    assert curve([1e4], 0.2, 0.6, 2.0, 1e4)[0] == pytest.approx(0.4)
    assert curve([1e9], 0.2, 0.6, 2.0, 1e4)[0] == pytest.approx(0.6)


@pytest.mark.parametrize("compute,acc,why", [
    (TOKENS[:MIN_POINTS], curve(TOKENS[:MIN_POINTS], 0.3, 0.5, 1.0, 3e4), "too few evals to fit (3 after the start"),
    (TOKENS, 0.3 + np.array([0, 0.01, -0.01, 0.0, 0.005, 0.0, 0.01, -0.005]), "flat: no eval moves 0.02"),
    (TOKENS[1:], curve(TOKENS[1:], 0.3, 0.5, 1.0, 3e4), "no eval at compute 0"),
    (TOKENS, 0.3 + TOKENS * 1e-6, "has not bent within the budget"),  # a straight line: the ceiling lies beyond
])
def test_bad_curves_give_a_note_instead_of_a_number(compute, acc, why):
    f = fit_curve(compute, acc)
    assert not f.ok and why in f.note
    assert math.isnan(f.A) and math.isnan(f.B)


def test_a_rise_before_the_first_eval_keeps_its_plateau_without_a_shape():
    """Most of the gain lands before the first eval after the start (C_mid 2k, first eval at 10k): A is measured
    (the plateau), B and C_mid are not."""
    f = fit_curve(TOKENS, curve(TOKENS, 0.33, 0.52, 3.0, 2e3))
    assert f.A == pytest.approx(0.52, abs=5e-3) and math.isnan(f.B) and math.isnan(f.c_mid)
    assert "before the first eval" in f.note and not f.ok


def _sweep(root, arms: dict[str, tuple[float, float, float]], seeds=(0, 1, 2, 3), **kw):
    for algo, (A, B, c_mid) in arms.items():
        for s in seeds:  # seeds spread the ceiling by +-0.015 and the efficiency by +-0.15
            make_run(root, algo=algo, seed=s, steps=20, eval_every=2, tokens_per_step=5000, start_acc=0.3,
                     acc_curve=(A + 0.01 * (s - 1.5), B + 0.1 * (s - 1.5), c_mid), **kw)
    return root


def test_report_prints_and_writes_a_and_b_with_differences_to_the_baseline(tmp_path):
    """grpo's ceiling is 0.1 above rloo's at the same efficiency; ppo is as high as rloo but twice as steep."""
    sweep = _sweep(tmp_path / "sweep", {"rloo": (0.5, 1.0, 30e3), "grpo": (0.6, 1.0, 30e3), "ppo": (0.5, 2.0, 30e3)})
    out = tmp_path / "out"
    buf = io.StringIO()
    rc = report.main([str(sweep), "--baseline", "rloo", "--out", str(out)], console=Console(file=buf, width=250))
    text = buf.getvalue()
    assert rc == 0
    fit = pd.read_csv(out / "fit.csv").set_index("algo")
    assert (fit["fitted"] == 4).all() and (fit["fitted_B"] == 4).all() and (fit["runs"] == 4).all()
    assert fit.loc["grpo", "A_mean"] == pytest.approx(0.6, abs=2e-3)
    assert fit.loc["grpo", "B_mean"] == pytest.approx(1.0, abs=2e-2)
    assert fit.loc["grpo", "dA"] == pytest.approx(0.1, abs=3e-3) and fit.loc["grpo", "pA_holm"] < 0.01
    assert fit.loc["ppo", "dB"] == pytest.approx(1.0, abs=0.05) and fit.loc["ppo", "pB_holm"] < 0.01
    assert abs(fit.loc["ppo", "dA"]) < 3e-3 and fit.loc["ppo", "pA_holm"] > 0.05
    assert fit.loc["rloo", "is_baseline"] and np.isnan(fit.loc["rloo", "dA"])
    assert fit.loc["grpo", "A_ci_lo"] <= fit.loc["grpo", "A_mean"] <= fit.loc["grpo", "A_ci_hi"]
    per_run = pd.read_csv(out / "fit_runs.csv")
    assert len(per_run) == 12 and set(per_run.columns) >= {"run_dir", "seed", "fit_A", "fit_B", "fit_c_mid", "fit_note"}
    md = (out / "report.md").read_text()
    assert "compute-fitted curves" in md and "ΔA vs rloo [95% CI]" in md and "ScaleRL" in md
    assert "compute-fitted curves" in text and "A (ceiling)" in text
    assert (out / "plots" / "fit_arith.png").exists() and (out / "plots" / "fit_arith.pdf").exists()


def test_report_says_why_runs_with_too_few_evals_get_no_fit(tmp_path):
    for s in (0, 1):
        make_run(tmp_path / "sweep", algo="grpo", seed=s, steps=10, eval_every=5)  # 2 evals after the start
    out = tmp_path / "out"
    rc = report.main([str(tmp_path / "sweep"), "--out", str(out), "--no-plots", "--fit-compute", "wall"],
                     console=Console(file=io.StringIO(), width=250))
    assert rc == 0
    fit = pd.read_csv(out / "fit.csv")
    assert fit.loc[0, "fitted"] == 0 and np.isnan(fit.loc[0, "A_mean"])
    assert "2 run(s): too few evals to fit (2 after the start" in fit.loc[0, "notes"]
    assert "training wall time" in (out / "report.md").read_text()
