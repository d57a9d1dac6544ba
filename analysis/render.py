"""Render summary tables: console (rich), Markdown, CSV, LaTeX (booktabs)."""

from __future__ import annotations

import io

import pandas as pd

from analysis.collect import CONTROL_PREFIX, PERF_KEYS
from analysis.columns import columns
from analysis.columns import is_nan as _nan
from analysis.tables import TEST_NAME, TaskTable

# (column, direction) for "best value in bold": +1 higher is better, -1 lower is better.
BOLD_RULES = {"final acc": ("eval_final_mean", 1), "best acc": ("eval_best_mean", 1), "AUC": ("auc_mean", 1),
              "tokens to target": ("tokens_to_target", -1), "wall to target": ("wall_s_to_target", -1),
              "step s": ("step_s", -1)}


def fmt_count(x: float) -> str:
    if _nan(x):
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.0f}"


def fmt_seconds(x: float) -> str:
    if _nan(x):
        return "-"
    if x < 10:
        return f"{x:.2f} s"
    if x < 1000:
        return f"{x:.0f} s"
    if x < 36000:
        return f"{x / 60:.1f} min"
    return f"{x / 3600:.1f} h"


def fmt_stat(r, col: str, ci: bool = True) -> str:
    m, s = r[f"{col}_mean"], r[f"{col}_std"]
    if _nan(m):
        return "-"
    if r.get("n_seeds", 2) == 1:  # one seed: a value, no spread or interval to show
        return f"{m:.3f} (1 seed)"
    out = f"{m:.3f} ± {s:.3f}"
    if ci:
        out += f" [{r[f'{col}_ci_lo']:.3f}, {r[f'{col}_ci_hi']:.3f}]"
    return out


def _after(r, col: str) -> str:
    """A score after training: mean ± std [95% CI] over the seeds scored, (k/n) when not all were."""
    n = r.get(f"{col} n", 0)
    if not n:
        return "-"
    m, sd = r[f"{col} mean"], r[f"{col} std"]
    text = f"{m:.3f} (1 seed)" if n == 1 else f"{m:.3f} ± {sd:.3f} [{r[f'{col} ci_lo']:.3f}, {r[f'{col} ci_hi']:.3f}]"
    return text + (f" ({n}/{r['n_seeds']})" if n < r["n_seeds"] else "")


def _kl(r) -> str:
    if r["kl_placement"] == "none" or not r["kl_coef"]:
        return "none"
    return f"{r['kl_placement']} {r['kl_kind']} {r['kl_coef']:g}"


def _budget(r) -> str:
    ends = "" if r["budget"].startswith("steps=") else f"{r['budget']}, <= "  # tokens/wall budgets: steps is a cap
    return (f"{ends}{r['steps']} st x {r['prompts_per_step']}x{r['samples_per_prompt']} seq, <= {r['max_response_tokens']} tok; "
            f"{fmt_count(r['generated_tokens'])} tok; {fmt_seconds(r['wall_s'])}")


def _tuning(r) -> str:
    """``full``, or the LoRA settings with the policy's trainable parameter count."""
    label = str(r.get("tuning", "full"))
    n = r.get("trainable_params", float("nan"))
    return label if label == "full" or _nan(n) else f"{label} ({fmt_count(n)} trained)"


def _comparison(r, baseline: str) -> list[str]:
    """Δ [CI], p (Holm-corrected p), MDE cells of one row."""
    if r.get("is_baseline", r["algo"] == baseline):
        return ["baseline", "", ""]
    if _nan(r["delta"]):
        return ["-", "-", "-"]
    ci = "" if _nan(r["delta_ci_lo"]) else f" [{r['delta_ci_lo']:+.3f}, {r['delta_ci_hi']:+.3f}]"
    p = "-" if _nan(r["p_value"]) else f"{r['p_value']:.2g} ({r['p_holm']:.2g})"
    return [f"{r['delta']:+.3f}{ci}", p, "-" if _nan(r["mde"]) else f"{r['mde']:.3f}"]


def display(table: TaskTable, baseline: str | None) -> tuple[list[str], list[list[str]], list[list[bool]]]:
    """Header, formatted cells and bold flags of one task's table (shared by every format)."""
    df = table.rows
    final, best = f"final acc ({table.protocol})", f"best acc ({table.protocol})"
    after = list(table.after_columns)
    headers = ["algo", "seeds", final, best, *after, "AUC", "tokens to target", "wall to target", "step s"]
    rules = {final: BOLD_RULES["final acc"], best: BOLD_RULES["best acc"], **{c: (f"{c} mean", 1) for c in after},
             **{h: BOLD_RULES[h] for h in ("AUC", "tokens to target", "wall to target", "step s")}}
    has_delta = baseline is not None and "delta" in df.columns and bool(df.get("is_baseline", df["algo"] == baseline).any())
    if has_delta:
        headers += [f"Δ final vs {baseline} [95% CI]", "p (Holm)", "MDE"]
    headers += ["loss agg", "std norm", "KL", "checker", "budget", "model", "tuning", "warm start"]
    declared = [c for c in columns() if c.is_shown(df)]  # the declared columns some row has (analysis/columns.py)
    headers += [c.header for c in declared]
    cells, bold = [], []
    for _, r in df.iterrows():
        name = r["algo"] + (f" [{r['variant']}]" if r["variant"] else "")
        if has_delta and r.get("budget_differs"):
            name += " †"  # not on the baseline's budget: see the notes
        reached = f" ({r['target_reached']}/{r['n_seeds']})"
        row = [
            name,
            str(r["n_seeds"]),
            fmt_stat(r, "eval_final"),
            fmt_stat(r, "eval_best"),
            *[_after(r, c) for c in after],
            fmt_stat(r, "auc", ci=False),
            fmt_count(r["tokens_to_target"]) + reached,
            fmt_seconds(r["wall_s_to_target"]) + reached,
            f"{r['step_s']:.2f} (" + "/".join(f"{r[f'{k}_s']:.2f}" for k in PERF_KEYS) + ")",
        ]
        if has_delta:
            row += _comparison(r, baseline)
        row += [r["loss_agg"], r["std_norm"], _kl(r), r["checker"], _budget(r), r["model"], _tuning(r), r["warm_start"]]
        row += [c.cell(r) for c in declared]
        cells.append(row)
        bold.append([False] * len(row))
    if len(df) > 1:
        for label, (col, sign) in rules.items():
            vals = df[col].astype(float)
            if vals.notna().sum() == 0 or vals.nunique() == 1:
                continue
            best = vals.max() if sign > 0 else vals.min()
            j = headers.index(label)
            for i, v in enumerate(vals):
                if not _nan(v) and abs(v - best) <= 1e-12:
                    bold[i][j] = True
    return headers, cells, bold


def notes(table: TaskTable, baseline: str | None) -> list[str]:
    target = "n/a" if _nan(table.target) else f"{table.target:.3f}"
    out = [f"target accuracy {target} ({table.target_source}); tokens/wall to target: median over "
           "seeds that reached it (reached/seeds)",
           f"final/best acc: the training run's evals ({table.protocol}), mean ± std [95% bootstrap CI] over seeds; "
           "AUC: eval accuracy vs step, trapezoid / steps",
           "step s: median seconds per step (rollout/score/logp/update/sync)"]
    if table.after_columns:
        out.append("final ckpt <protocol>, N prompts: the final checkpoint scored after training (harness eval "
                   "SWEEP_DIR) by that protocol (greedy@1; mean@K, pass@K, maj@K: K samples at temperature T), mean ± "
                   "std [95% bootstrap CI] over seeds; evals.csv holds each run's score with its 95% interval over "
                   "prompts (Wilson for 0/1 scores, bootstrap otherwise)")
    if "variant" in table.rows and table.rows["variant"].str.startswith(CONTROL_PREFIX).any():
        out.append("control: a run trained on a random reward (reward.source=random: 1 with probability p whatever "
                   "the answer; Spurious Rewards, arXiv 2506.10947): what training gains without the checker's "
                   "information. A gain over it is learning from the reward")
    if baseline is not None:
        out.append(f"Δ: difference of mean final accuracy to {baseline}; {TEST_NAME}")
        if "budget_differs" in table.rows and table.rows["budget_differs"].any():
            out.append(f"†: this row's budget differs from {baseline}'s (budget, batch shape, response cap, warm start "
                       "or generated tokens > 10% apart): not a like-for-like comparison")
    return out


def _title(table: TaskTable) -> str:
    return f"task {table.task}"


# ----------------------------------------------------------------------------- console
def console_tables(tables: list[TaskTable], baseline: str | None, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    for t in tables:
        headers, cells, bold = display(t, baseline)
        for w in t.warnings:
            console.print(f"[bold red]WARNING:[/] {w}", markup=True, highlight=False)
        # Two tables (results, then the knobs that change them) so a terminal need not fold
        # 15 columns; the files keep one table.
        split = headers.index("loss agg")
        for title, cols in ((_title(t), range(split)),
                            (f"{_title(t)}: settings", [0, *range(split, len(headers))])):
            rt = Table(title=title, title_justify="left", header_style="bold")
            for j in cols:
                rt.add_column(headers[j], overflow="fold")
            for row, b in zip(cells, bold):
                # escape: a variant label such as "[model.lora.rank=8]" would parse as a style tag
                rt.add_row(*[f"[bold green]{escape(row[j])}[/]" if b[j] else escape(row[j]) for j in cols])
            console.print(rt)
        for n in notes(t, baseline):
            console.print(f"  [dim]{n}[/]", highlight=False)


# ----------------------------------------------------------------------------- markdown
def _md_escape(s: str) -> str:
    return s.replace("|", "\\|")


def markdown(tables: list[TaskTable], baseline: str | None, skipped: list[tuple[str, str]]) -> str:
    out = ["# Results", ""]
    for t in tables:
        headers, cells, bold = display(t, baseline)
        out += [f"## {_title(t)}", ""]
        out += [f"> **WARNING:** {w}" for w in t.warnings]
        if t.warnings:
            out.append("")
        out.append("| " + " | ".join(_md_escape(h) for h in headers) + " |")
        out.append("|" + "|".join("---" for _ in headers) + "|")
        for row, b in zip(cells, bold):
            out.append("| " + " | ".join(f"**{_md_escape(c)}**" if bb else _md_escape(c) for c, bb in zip(row, b)) + " |")
        out.append("")
        out += [f"- {n}" for n in notes(t, baseline)]
        out.append("")
    if skipped:
        out += ["## Skipped run directories", ""]
        out += [f"- `{d}`: {why}" for d, why in skipped]
        out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------- CSV
CSV_COLUMNS = [
    "task", "algo", "variant", "n_seeds", "seeds",
    "eval_protocol", "eval_final_mean", "eval_final_std", "eval_final_ci_lo", "eval_final_ci_hi",
    "eval_best_mean", "eval_best_std", "eval_best_ci_lo", "eval_best_ci_hi",
    "auc_mean", "auc_std", "auc_ci_lo", "auc_ci_hi",
    "target", "target_reached", "steps_to_target", "tokens_to_target", "wall_s_to_target",
    "step_s", *[f"{k}_s" for k in PERF_KEYS], "delta", "delta_ci_lo", "delta_ci_hi", "p_value", "p_holm", "mde",
    "is_baseline", "budget_differs", "loss_agg", "std_norm", "kl_placement", "kl_kind", "kl_coef", "checker", "model", "tuning",
    "trainable_params", "env", "pipeline", "warm_start", "budget", "steps", "prompts_per_step", "samples_per_prompt",
    "max_response_tokens", "generated_tokens", "wall_s",
    "warnings",
]


def csv_text(tables: list[TaskTable]) -> str:
    """Raw numbers, one row per setting; warnings as leading '# WARNING:' lines (read with comment='#')
    and repeated in a ``warnings`` column."""
    frames = []
    lines = []
    after: list[str] = []
    for t in tables:
        lines += [f"# WARNING: task {t.task}: {w}" for w in t.warnings]
        df = t.rows.copy()
        df["eval_protocol"] = t.protocol
        after += [c for c in t.after_columns if c not in after]
        df["target"] = t.target
        df["warnings"] = "; ".join(t.warnings)
        frames.append(df)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=CSV_COLUMNS)
    at = CSV_COLUMNS.index("eval_best_mean")  # the final checkpoint's scores beside the training evals
    declared = [name for c in columns() for name in c.values]  # the declared columns' values, before "warnings"
    df = df.reindex(columns=CSV_COLUMNS[:at] + [f"{c} {s}" for c in after for s in ("mean", "std", "ci_lo", "ci_hi", "n")]
                    + CSV_COLUMNS[at:-1] + declared + CSV_COLUMNS[-1:])
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    return "".join(line + "\n" for line in lines) + buf.getvalue()


# ----------------------------------------------------------------------------- LaTeX
_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def tex_escape(s: str) -> str:
    s = "".join(_TEX.get(ch, ch) for ch in str(s))
    return s.replace("±", r"$\pm$").replace("Δ", r"$\Delta$").replace("<=", r"$\leq$")


def latex(tables: list[TaskTable], baseline: str | None) -> str:
    """One booktabs ``table`` per task (needs \\usepackage{booktabs}); best values in bold."""
    out = ["% generated by `harness report`; needs \\usepackage{booktabs}"]
    for t in tables:
        headers, cells, bold = display(t, baseline)
        out += [r"\begin{table}[t]", r"\centering", r"\scriptsize",
                r"\caption{" + tex_escape(f"Results on {t.task}.") + "}"]
        for w in t.warnings:
            out.append(f"% WARNING: {w}")
            out.append(r"\par\textbf{Warning:} " + tex_escape(w) + r"\par")
        out.append(r"\begin{tabular}{" + "l" * len(headers) + "}")
        out.append(r"\toprule")
        out.append(" & ".join(tex_escape(h) for h in headers) + r" \\")
        out.append(r"\midrule")
        for row, b in zip(cells, bold):
            out.append(" & ".join(r"\textbf{" + tex_escape(c) + "}" if bb else tex_escape(c)
                                  for c, bb in zip(row, b)) + r" \\")
        out.append(r"\bottomrule")
        out.append(r"\end{tabular}")
        out.append(r"\par\smallskip\raggedright " + tex_escape("; ".join(notes(t, baseline))) + r"\par")
        out.append(r"\end{table}")
        out.append("")
    return "\n".join(out)
