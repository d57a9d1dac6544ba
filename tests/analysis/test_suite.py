"""Suite aggregates (analysis/suite.py, rliable): hand-computed values, and two synthetic suites with a
known answer -- one algorithm dominating everywhere, and two that are the same algorithm."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.suite import Suite, SuiteError, aggregate_table, plot_suite, suite_scores

REPS = 400  # enough for a stable 95% interval on these clear cases, and fast


def runs(spec: dict[str, dict[str, list[float]]], first: float = 0.2) -> pd.DataFrame:
    """algo -> task -> final accuracies of its seeds."""
    return pd.DataFrame([{"algo": a, "task": t, "seed": s, "eval_first": first, "eval_final": v}
                         for a, tasks in spec.items() for t, values in tasks.items() for s, v in enumerate(values)])  # fmt: skip


def test_normalisation_and_aggregates_by_hand():
    # floor = the task's mean eval_first (0.2), ceiling 1.0: 0.2 -> 0, 0.6 -> 0.5, 1.0 -> 1
    suite = suite_scores(runs({"x": {"t1": [0.2, 0.6, 1.0, 0.6], "t2": [0.2, 0.2, 1.0, 0.6]}}))
    assert suite.bounds == {"t1": (0.2, 1.0), "t2": (0.2, 1.0)}
    assert np.allclose(suite.scores["x"], [[0, 0], [0.5, 0], [1, 1], [0.5, 0.5]])
    row = aggregate_table(suite, reps=REPS).iloc[0]
    # IQM: the middle 50% of the 8 scores 0,0,0,0.5,0.5,0.5,1,1 -> 0, 0.5, 0.5, 0.5 -> 0.375
    assert row["iqm"] == pytest.approx(0.375) and row["mean"] == pytest.approx(3.5 / 8)
    assert row["optimality_gap"] == pytest.approx(1 - 3.5 / 8)
    assert row["iqm_low"] <= row["iqm"] <= row["iqm_high"]
    # stated bounds; scores above the ceiling count as 1 in the optimality gap
    over = suite_scores(runs({"x": {"t1": [0.5, 1.0], "t2": [0.5, 1.0]}}), bounds={"t1": (0.0, 0.5), "t2": (0.0, 1.0)})
    assert np.allclose(over.scores["x"], [[1.0, 0.5], [2.0, 1.0]])
    assert aggregate_table(over, reps=REPS).iloc[0]["optimality_gap"] == pytest.approx(1 - (1 + 0.5 + 1 + 1) / 4)


def test_a_dominating_algorithm_is_found():
    rng = np.random.default_rng(1)
    spec = {a: {t: list(0.4 + shift + rng.normal(0, 0.03, 5)) for t in ("arith", "calc", "reasoning")}
            for a, shift in (("strong", 0.3), ("base", 0.0))}  # fmt: skip
    table = aggregate_table(suite_scores(runs(spec)), baseline="base", reps=REPS).set_index("algo")
    assert table.index[0] == "strong"
    assert table.loc["strong", "iqm_low"] > table.loc["base", "iqm_high"]  # intervals apart
    assert table.loc["strong", "gap_high"] < table.loc["base", "gap_low"]
    assert table.loc["strong", "p_improve"] == pytest.approx(1.0) and table.loc["strong", "p_low"] > 0.9
    assert np.isnan(table.loc["base", "p_improve"])


def test_two_runs_of_one_algorithm_are_not_told_apart():
    rng = np.random.default_rng(2)
    spec = {a: {t: list(0.5 + rng.normal(0, 0.05, 5)) for t in ("arith", "calc", "reasoning")} for a in ("x", "y")}
    table = aggregate_table(suite_scores(runs(spec)), baseline="y", reps=REPS).set_index("algo")
    assert table.loc["x", "p_low"] < 0.5 < table.loc["x", "p_high"]  # P(X > Y) cannot be told from a coin flip
    assert table.loc["x", "iqm_low"] < table.loc["y", "iqm_high"] and table.loc["y", "iqm_low"] < table.loc["x", "iqm_high"]


def test_the_same_data_gives_the_same_intervals():
    spec = {a: {t: [0.3, 0.5, 0.4] for t in ("t1", "t2")} for a in ("x", "y")}
    one = aggregate_table(suite_scores(runs(spec)), baseline="y", reps=REPS)
    import logging

    handlers = list(logging.root.handlers)  # rliable's absl logging leaves the root logger as it was
    np.random.seed(123)  # the global generator's state does not matter (and is put back)
    state = np.random.get_state()[1].copy()
    two = aggregate_table(suite_scores(runs(spec)), baseline="y", reps=REPS)
    pd.testing.assert_frame_equal(one, two)
    assert (np.random.get_state()[1] == state).all() and logging.root.handlers == handlers


def test_runs_that_do_not_make_a_suite_are_refused():
    with pytest.raises(SuiteError, match="2 or more tasks"):
        suite_scores(runs({"x": {"t1": [0.5]}}))
    partial = suite_scores(runs({"x": {"t1": [0.5], "t2": [0.5]}, "y": {"t1": [0.5]}}))
    assert list(partial.scores) == ["x"] and partial.notes == ("y left out: no runs on t2",)
    with pytest.raises(SuiteError, match="no algorithm has runs on every task"):
        suite_scores(runs({"x": {"t1": [0.5]}, "y": {"t2": [0.5]}}))
    uneven = suite_scores(runs({"x": {"t1": [0.5, 0.6, 0.7], "t2": [0.5, 0.6]}}))
    assert uneven.scores["x"].shape == (2, 2) and "left out: 1 on t1" in uneven.notes[0]
    with pytest.raises(SuiteError, match="ceiling 1.0 must lie above floor 1.0"):
        suite_scores(runs({"x": {"t1": [0.5], "t2": [0.5]}}), bounds={"t1": (1.0, 1.0)})
    with pytest.raises(SuiteError, match="baseline 'z'"):
        aggregate_table(suite_scores(runs({"x": {"t1": [0.5], "t2": [0.5]}})), baseline="z", reps=REPS)


def test_the_plots_are_written(tmp_path):
    spec = {a: {t: [0.3 + d, 0.5 + d, 0.4 + d] for t in ("t1", "t2")} for a, d in (("x", 0.2), ("y", 0.0))}
    suite = suite_scores(runs(spec))
    paths = plot_suite(suite, aggregate_table(suite, baseline="y", reps=REPS), tmp_path)
    assert [p.name for p in paths] == ["suite_intervals.png", "suite_profiles.png"]
    assert all(p.stat().st_size > 5000 for p in paths)


def test_an_algorithms_interval_does_not_depend_on_the_others():
    rng = np.random.default_rng(3)
    spec = {a: {t: list(0.5 + rng.normal(0, 0.05, 5)) for t in ("t1", "t2")} for a in ("x", "y", "z")}
    alone = aggregate_table(suite_scores(runs({"x": spec["x"], "y": spec["y"]})), baseline="y", reps=REPS)
    together = aggregate_table(suite_scores(runs(spec)), baseline="y", reps=REPS)
    pd.testing.assert_frame_equal(alone.set_index("algo").loc[["x", "y"]], together.set_index("algo").loc[["x", "y"]])
    assert isinstance(suite_scores(runs(spec)), Suite)
