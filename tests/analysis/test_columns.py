"""Report columns declared once (analysis/columns.py): one declaration feeds the console, Markdown, CSV and LaTeX
outputs; a bad declaration or plugin module is refused with a message that names it."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from fake_runs import make_run
from rich.console import Console

from analysis import report
from analysis.columns import REPORT_COLUMNS, Column, register_column, training_mean


def run_report(argv):
    buf = io.StringIO()
    rc = report.main(argv, console=Console(file=buf, width=400, color_system=None))
    return rc, buf.getvalue()


@pytest.fixture
def fresh_columns(monkeypatch):
    monkeypatch.setattr(REPORT_COLUMNS, "_entries", dict(REPORT_COLUMNS.entries()))  # global: a copy for this test


def test_a_registered_column_reaches_every_output_with_its_seeds_aggregated(tmp_path, fresh_columns):
    """Two seeds per algorithm, final accuracy 0.5 / 0.7 (grpo) and 0.3 / 0.4 (rloo): aggregate=max gives 0.70 and
    0.40; the training mean of rollout/truncated_frac (0 at every step of a fake run) gives 0.00."""
    for seed, (g, r) in enumerate([(0.5, 0.3), (0.7, 0.4)]):
        make_run(tmp_path, algo="grpo", seed=seed, final_acc=g)
        make_run(tmp_path, algo="rloo", seed=seed, final_acc=r)
    register_column("best_seed", Column(
        header="best seed's final acc", aggregate="max",
        values={"final_acc_max": lambda run: float(run.evals["eval_acc"].iloc[-1]),
                "truncated_mean": training_mean("rollout/truncated_frac")},
        cell=lambda row: f"{row['final_acc_max']:.2f} / {row['truncated_mean']:.2f}"))  # fmt: skip
    rc, console = run_report([str(tmp_path), "--no-plots"])
    assert rc == 0, console
    assert "best seed's final acc" in console and "0.70 / 0.00" in console
    out = tmp_path / "report"
    md = (out / "report.md").read_text()
    assert "| best seed's final acc |" in md and "| 0.70 / 0.00 |" in md and "| 0.40 / 0.00 |" in md
    csv = pd.read_csv(out / "summary.csv", comment="#").set_index("algo")
    assert csv.loc["grpo", "final_acc_max"] == pytest.approx(0.7) and csv.loc["rloo", "final_acc_max"] == pytest.approx(0.4)
    assert csv.loc["grpo", "truncated_mean"] == 0.0 and list(csv.columns)[-1] == "warnings"
    tex = (out / "table.tex").read_text()
    assert "best seed's final acc" in tex and "0.70 / 0.00" in tex


def test_a_column_no_run_has_adds_nothing(tmp_path, fresh_columns):
    make_run(tmp_path, algo="grpo", seed=0)
    register_column("absent", Column(header="never logged", values={"nothing": training_mean("no/such_metric")},
                                     cell=lambda row: "x"))
    assert run_report([str(tmp_path), "--no-plots"])[0] == 0
    assert "never logged" not in (tmp_path / "report" / "report.md").read_text()
    assert pd.read_csv(tmp_path / "report" / "summary.csv", comment="#")["nothing"].isna().all()


def test_a_reader_that_fails_leaves_its_value_empty_and_says_so(tmp_path, fresh_columns, caplog):
    make_run(tmp_path, algo="grpo", seed=0)
    register_column("broken", Column(header="broken", values={"broken_value": lambda run: run.info["no_such_key"]},
                                     cell=lambda row: "x"))
    assert run_report([str(tmp_path), "--no-plots"])[0] == 0  # the report is still written
    assert "report column 'broken': value 'broken_value' failed on" in caplog.text and "KeyError" in caplog.text
    assert pd.read_csv(tmp_path / "report" / "summary.csv", comment="#")["broken_value"].isna().all()


def test_bad_declarations_and_plugin_modules_are_refused(tmp_path, fresh_columns):
    with pytest.raises(ValueError, match=r"aggregate='mode'; one of mean, median, max, min"):
        Column(header="h", values={"v": training_mean("m")}, cell=str, aggregate="mode")
    with pytest.raises(ValueError, match="values is empty"):
        Column(header="h", values={}, cell=str)
    with pytest.raises(ValueError, match="report column 'mismatch' is already registered by analysis.columns"):
        register_column("mismatch", Column(header="h", values={"v": training_mean("m")}, cell=lambda row: "mine"))
    with pytest.raises(TypeError, match="a Column, not dict"):
        register_column("mine", {"header": "h"})
    make_run(tmp_path, algo="grpo", seed=0)
    rc, console = run_report([str(tmp_path), "--no-plots", "--plugins", "no_such_pkg.columns"])
    assert rc == 2 and "--plugins no_such_pkg.columns: ModuleNotFoundError" in console
