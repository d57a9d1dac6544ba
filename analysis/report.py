"""``harness report DIR... [--baseline ALGO] [--algos A,B] [--out DIR] [--format ...] [--target-accuracy X]``.

Collects every run under DIR (recursively), writes ``runs.parquet`` / ``metrics.parquet``
(and ``evals.csv``: every score of `harness eval SWEEP_DIR`, with its interval over prompts),
summary tables (Markdown ``report.md``, ``summary.csv``, LaTeX ``table.tex``) and figures
(``plots/*.png|pdf``) to ``--out`` (default ``<first DIR>/report``), and prints the table
and the written paths. Unusable run directories are listed with the reason, never fatal.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

FORMATS = ("console", "markdown", "csv", "latex")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="harness report",
        description="Tables and figures from run directories (recursively): statistics over seeds.",
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="run directories or folders holding them (searched recursively)")
    p.add_argument("--baseline", metavar="ALGO", help="add columns: difference to ALGO's final accuracy [95%% CI], Welch p (Holm-corrected), MDE; † marks rows whose budget differs")
    p.add_argument("--algos", metavar="A,B", help="only these algorithms' runs (comma-separated), e.g. to compare two apart")
    p.add_argument("--out", metavar="DIR", help="output folder (default: <first DIR>/report)")
    p.add_argument("--format", action="append", metavar="FMT",
                   help=f"any of {', '.join(FORMATS)}, all (default: all); repeat or comma-separate. "
                        "The table is always printed to the console; parquet files are always written.")
    p.add_argument("--target-accuracy", type=float, metavar="X",
                   help="accuracy for tokens/wall-to-target (default: 0.9 x the best mean best-accuracy per task)")
    p.add_argument("--fit-compute", choices=("tokens", "wall"), default="tokens",
                   help="compute axis of the fitted curves R(C) (ScaleRL's ceiling A and efficiency B): generated "
                        "tokens (default) or training wall seconds")
    p.add_argument("--controls", metavar="PRESET",
                   help="positive controls' verdicts: the predictions under PRESET's 'verdicts' (a name in sweeps/, "
                        "e.g. controls, or a path) applied to these runs; writes controls.md and plots/control_*")
    p.add_argument("--factors", metavar="KEY,KEY",
                   help="config keys the runs cross (e.g. algo.name,trainer.lr): a main-effects table with 95%% CIs "
                        "and Holm p, and an interaction test; says so when the design is not a full factorial "
                        "(default: the keys that vary, shown only when they form a full factorial)")
    p.add_argument("--reference", action="append", metavar="KEY=VALUE", default=[],
                   help="a factor's reference level for the main effects (default: its first level, numbers "
                        "ascending); repeatable")
    p.add_argument("--plugins", metavar="MODULE", action="append", default=[],
                   help="import MODULE first (repeatable): a module that registers report columns "
                        "(analysis.columns.register_column; docs/adding_a_report_column.md)")
    p.add_argument("--no-plots", action="store_true", help="skip the figures")
    return p


def _formats(values: list[str] | None) -> set[str]:
    if not values:
        return set(FORMATS)
    out: set[str] = set()
    for v in values:
        for f in v.split(","):
            f = f.strip().lower()
            f = {"md": "markdown", "tex": "latex", "rich": "console"}.get(f, f)
            if f == "all":
                out |= set(FORMATS)
            elif f in FORMATS:
                out.add(f)
            elif f:
                raise ValueError(f"--format {f!r}: use {', '.join(FORMATS)} or all")
    return out


def main(argv: list[str] | None = None, console: Console | None = None) -> int:
    """Entry point of ``harness report``; returns the exit status (0 ok, 1 no usable runs, 2 bad arguments)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    if console is None:
        console = Console()
        if not console.is_terminal:  # piped/logged: don't squeeze the wide table into 80 columns
            console = Console(width=200)
    try:
        formats = _formats(args.format)
    except ValueError as exc:
        console.print(f"error: {exc}", highlight=False)
        return 2

    import importlib

    from analysis.collect import collect
    from analysis.render import console_tables, csv_text, latex, markdown
    from analysis.tables import build_tables

    for module in args.plugins:  # a user's report columns, registered when their module is imported
        try:
            importlib.import_module(module)
        except Exception as exc:  # not found, or an error inside it: say which module, and why
            console.print(f"[bold red]error:[/] --plugins {module}: {type(exc).__name__}: {exc}", highlight=False)
            return 2

    col = collect(args.dirs)
    out = Path(args.out) if args.out else Path(args.dirs[0]) / "report"
    for d, why in col.skipped:
        console.print(f"[yellow]skipped[/] {d}: {why}", highlight=False)
    if col.runs.empty:
        console.print(f"[bold red]error:[/] no finished training runs under {', '.join(args.dirs)}", highlight=False)
        return 1
    if args.algos:
        wanted = {a.strip() for a in args.algos.split(",") if a.strip()}
        missing = wanted - set(col.runs["algo"])
        if missing:
            console.print(f"[bold red]error:[/] --algos {', '.join(sorted(missing))}: no runs; algorithms found: "
                          f"{', '.join(sorted(col.runs['algo'].unique()))}", highlight=False)
            return 2
        col.runs = col.runs[col.runs["algo"].isin(wanted)].reset_index(drop=True)
        col.metrics = col.metrics[col.metrics["algo"].isin(wanted)].reset_index(drop=True)
        if not col.evals.empty:
            col.evals = col.evals[col.evals["algo"].isin(wanted)].reset_index(drop=True)
    if args.baseline and args.baseline not in set(col.runs["algo"]):
        console.print(f"[bold red]error:[/] --baseline {args.baseline!r} has no runs; algorithms found: "
                      f"{', '.join(sorted(col.runs['algo'].unique()))}", highlight=False)
        return 2

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    col.runs.to_parquet(out / "runs.parquet", index=False)
    col.metrics.to_parquet(out / "metrics.parquet", index=False)
    written += [out / "runs.parquet", out / "metrics.parquet"]
    if not col.evals.empty:  # evaluations after training (harness eval SWEEP_DIR), each with its interval over prompts
        col.evals.to_csv(out / "evals.csv", index=False, float_format="%.4f")
        written.append(out / "evals.csv")

    tables = build_tables(col.runs, col.metrics, baseline=args.baseline, target_accuracy=args.target_accuracy)
    console_tables(tables, args.baseline, console)
    if "markdown" in formats:
        (out / "report.md").write_text(markdown(tables, args.baseline, col.skipped))
        written.append(out / "report.md")
    if "csv" in formats:
        (out / "summary.csv").write_text(csv_text(tables))
        written.append(out / "summary.csv")
    if "latex" in formats:
        (out / "table.tex").write_text(latex(tables, args.baseline))
        written.append(out / "table.tex")
    written += _fits(col, tables, args, formats, out, console)
    try:
        written += _factorial(col, args, formats, out, console)
    except ValueError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    if args.controls:
        try:
            written += _controls(col, args, formats, out, console)
        except (OSError, ValueError) as exc:
            console.print(f"[bold red]error:[/] --controls {args.controls}: {exc}", highlight=False)
            return 2
    if not args.no_plots:
        from analysis.plots import make_plots

        written += make_plots(col.runs, col.metrics, out / "plots")
    written += _suite(col.runs, args, formats, out, console)

    n = len(col.runs)
    console.print(f"\n{n} run(s) in {sum(len(t.rows) for t in tables)} setting(s)"
                  + (f", {len(col.skipped)} directory(ies) skipped" if col.skipped else "") + "; wrote:",
                  highlight=False)
    for p in written:
        console.print(f"  {p}", highlight=False, soft_wrap=True)
    return 0


def _fits(col, tables, args: argparse.Namespace, formats: set[str], out: Path, console: Console) -> list[Path]:
    """Compute-fitted curves (analysis/curves.py): the per-setting table printed and appended to report.md,
    fit.csv (per setting) and fit_runs.csv (per run), plots/fit_<task>.png|pdf."""
    from analysis.curves import fit_console, fit_csv, fit_markdown, fit_runs, fit_tables, plot_fits

    fits = fit_runs(col.runs, col.metrics, compute=args.fit_compute)
    fts = fit_tables(tables, fits, args.baseline, compute=args.fit_compute)
    fit_console(fts, console)
    written = []
    if "markdown" in formats:
        with (out / "report.md").open("a") as f:
            f.write("\n" + fit_markdown(fts))
    if "csv" in formats:
        per_setting, per_run = fit_csv(fts, fits, col.runs)
        (out / "fit.csv").write_text(per_setting)
        (out / "fit_runs.csv").write_text(per_run)
        written += [out / "fit.csv", out / "fit_runs.csv"]
    if not args.no_plots:
        written += plot_fits(col.runs, col.metrics, fits, out / "plots", compute=args.fit_compute)
    return written


def _factorial(col, args: argparse.Namespace, formats: set[str], out: Path, console: Console) -> list[Path]:
    """Main effects of a factorial design (analysis/factorial.py), per task: printed, appended to report.md,
    main_effects.csv."""
    from analysis import factorial

    references = {}
    for item in args.reference:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"--reference {item!r}: write KEY=VALUE, e.g. --reference trainer.lr=0.0001")
        references[key.strip()] = value.strip()
    factors = [f.strip() for f in args.factors.split(",") if f.strip()] if args.factors else None
    if factors is not None and len(factors) < 2:
        raise ValueError(f"--factors {args.factors!r}: name two or more config keys, e.g. algo.name,trainer.lr")
    unknown = set(references) - set(factors or references)
    if unknown:
        raise ValueError(f"--reference {', '.join(sorted(unknown))}: not among --factors {args.factors}")
    found = [fa for task, truns in col.runs.groupby("task", sort=True)
             if (fa := factorial.analyse(str(task), truns, col.configs, factors, references)) is not None]
    if not found:
        return []
    text = factorial.markdown(found)
    console.print(text, highlight=False, markup=False)
    written = []
    if "markdown" in formats:
        with (out / "report.md").open("a") as f:
            f.write("\n" + text)
    if "csv" in formats and any(fa.effects for fa in found):
        factorial.csv_frame(found).to_csv(out / "main_effects.csv", index=False, float_format="%.5g")
        written.append(out / "main_effects.csv")
    return written


def _controls(col, args: argparse.Namespace, formats: set[str], out: Path, console: Console) -> list[Path]:
    """The positive controls' table (analysis/controls.py): printed, appended to report.md, controls.md, figures."""
    from analysis import controls

    spec = controls.read_controls(controls.resolve(args.controls))
    verdicts = controls.evaluate(spec, col.runs, col.metrics, col.configs)
    text = "## Positive controls\n\n" + controls.markdown(verdicts) + "\n"
    console.print(text, highlight=False, markup=False)
    empty = [v.control.name for v in verdicts if not v.versus_n or not all(v.arms_n)]
    if empty:
        console.print(f"[yellow]WARNING:[/] no runs for an arm of: {', '.join(empty)}", highlight=False)
    (out / "controls.md").write_text(text)
    written = [out / "controls.md"]
    if "markdown" in formats:
        with (out / "report.md").open("a") as f:
            f.write("\n" + text)
    if not args.no_plots:
        written += controls.plot(verdicts, col.runs, col.metrics, col.configs, out / "plots")
    return written


def _suite(runs, args: argparse.Namespace, formats: set[str], out: Path, console: Console) -> list[Path]:
    """Runs on 2 or more tasks: the suite aggregate (analysis/suite.py) -- table, CSV, plots."""
    from analysis.suite import SuiteError, aggregate_table, plot_suite, suite_markdown, suite_scores
    from analysis.tables import KNOB_KEYS

    if runs["task"].nunique() < 2:
        return []
    settings = runs.groupby(["algo", "task"])[[k for k in KNOB_KEYS if k in runs]]  # warm starts too: floors
    if (settings.nunique(dropna=False) > 1).any(axis=None):
        console.print("[yellow]suite aggregate skipped:[/] an algorithm has runs of several settings on one task; "
                      "pick one setting per algorithm with --algos or separate run folders", highlight=False)  # fmt: skip
        return []
    try:
        suite = suite_scores(runs)
        table = aggregate_table(suite, baseline=args.baseline)
    except SuiteError as exc:
        console.print(f"[yellow]suite aggregate skipped:[/] {exc}", highlight=False)
        return []
    text = suite_markdown(suite, table, args.baseline)
    console.print(text, highlight=False, markup=False)
    written = []
    if "markdown" in formats:
        with (out / "report.md").open("a") as f:
            f.write("\n" + text)
    if "csv" in formats:
        table.to_csv(out / "suite.csv", index=False, float_format="%.4f")
        written.append(out / "suite.csv")
    if not args.no_plots:
        written += plot_suite(suite, table, out / "plots")
    return written


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
