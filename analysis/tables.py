"""The summary table: one row per task x algorithm (x config variant), statistics over seeds."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.collect import AFTER_PREFIX, BUDGET_KEYS, PERF_KEYS
from analysis.columns import columns
from analysis.stats import ALPHA, POWER, bootstrap_ci, holm, mde, mean_std, welch

# Rows are split by these (besides task and algo): runs that differ here are different settings.
KNOB_KEYS = ("variant", "loss_agg", "std_norm", "kl_placement", "kl_coef", "kl_kind", "checker", "model", "tuning", "env",
             "pipeline",
             "warm_start",
             *BUDGET_KEYS)
TARGET_FRACTION = 0.9
TOKEN_TOLERANCE = 0.10  # generated tokens further than this from the baseline's: the row's budget differs
TEST_NAME = (f"Welch's two-sided t-test on mean final accuracy over seeds, 95% CI of the difference; p Holm-corrected "
             f"over the comparisons with the baseline; MDE: smallest difference detectable at alpha {ALPHA:g}, "
             f"power {POWER:g} with these seeds and the observed seed spread")


@dataclass
class TaskTable:
    task: str
    rows: pd.DataFrame  # one row per setting, raw numbers
    target: float
    target_source: str
    warnings: list[str] = field(default_factory=list)
    protocol: str = "greedy@1"  # how final/best acc were measured (``greedy@1, 128 prompts``; "mixed" with a warning)
    after_columns: list[str] = field(default_factory=list)  # the final checkpoint's scores (harness eval SWEEP_DIR)


def after_columns(runs: pd.DataFrame) -> list[str]:
    """The runs' columns of scores from evaluations after training, ordered greedy, mean, maj, pass, then by k."""
    cols = [c for c in runs.columns if str(c).startswith(AFTER_PREFIX) and runs[c].notna().any()]
    order = {"greedy": 0, "mean": 1, "maj": 2, "pass": 3}
    return sorted(cols, key=lambda c: (order.get(c[len(AFTER_PREFIX):].split("@")[0], 9), c))


def _protocol_warnings(runs: pd.DataFrame, after: list[str]) -> tuple[str, list[str]]:
    """(the training evals' protocol, warnings): several protocols in the accuracy columns are said loudly,
    as is a column of after-training scores that some runs lack."""
    out = []
    labels = sorted(runs["eval_protocol"].astype(str).unique()) if "eval_protocol" in runs else ["greedy@1"]
    protocol = labels[0]
    if len(labels) > 1:
        protocol = "MIXED protocols"
        out.append(f"MIXED PROTOCOLS in the final/best acc columns ({'; '.join(labels)}): runs were evaluated "
                   f"differently (task.eval_prompts?); their accuracies are not comparable")
    for col in after:
        have = int(runs[col].notna().sum())
        if have < len(runs):
            out.append(f"{col}: scored for {have} of {len(runs)} runs (harness eval SWEEP_DIR fills the rest; "
                       f"rows show the mean of the runs scored)")
    return protocol, out


def time_to_target(metrics: pd.DataFrame, target: float) -> tuple[float, float, float]:
    """(step, generated tokens, training wall s) at the first eval reaching ``target``; NaNs if never."""
    ev = metrics[metrics["eval_acc"].notna()].sort_values("step")
    hit = ev[ev["eval_acc"] >= target - 1e-12]
    if hit.empty:
        return float("nan"), float("nan"), float("nan")
    r = hit.iloc[0]
    return float(r["step"]), float(r["budget/generated_tokens"]), float(r["budget/wall_s"])


def _warnings(runs: pd.DataFrame) -> list[str]:
    out = []
    checkers = sorted(runs["checker"].astype(str).unique())
    if len({c.split("@")[0] for c in checkers}) < len(checkers):
        out.append(f"mixed checker versions in one table: {', '.join(checkers)}")
    elif len(checkers) > 1:
        out.append(f"different checkers in one table: {', '.join(checkers)}")
    one_token_budget = runs["budget"].nunique() == 1 and str(runs["budget"].iloc[0]).startswith("tokens=")
    for key in BUDGET_KEYS:
        if one_token_budget and key in ("steps", "samples_per_prompt"):
            continue  # the same token budget for all: steps and samples per step may differ by design
        vals = sorted(runs[key].unique())
        if len(vals) > 1:
            name = {"budget": "trainer.budget", "steps": "trainer.steps", "prompts_per_step": "trainer.prompts_per_step",
                    "samples_per_prompt": "algo.samples_per_prompt",
                    "max_response_tokens": "rollout.max_response_tokens"}[key]
            if key == "budget" and all(v.startswith("steps=") for v in vals):
                continue  # plain step budgets: reported by the trainer.steps line
            if key == "samples_per_prompt":  # a per-algorithm default: compare sequences per step instead
                seqs = sorted((runs["prompts_per_step"] * runs["samples_per_prompt"]).unique())
                if len(seqs) > 1:
                    out.append(f"mixed budgets: {name} differs ({', '.join(map(str, vals))}); "
                               f"sequences per step {', '.join(map(str, seqs))}")
                continue
            out.append(f"mixed budgets: {name} differs ({', '.join(map(str, vals))})")
    starts = sorted(runs["warm_start"].astype(str).unique()) if "warm_start" in runs else []
    if len(starts) > 1:
        out.append(f"DIFFERENT WARM STARTS in one table ({', '.join(starts)}): runs began from different weights "
                   f"(another machine built its own?); rows are split by warm start and must not be compared")
    # A control arm (a random reward) differs on purpose, and its rows say so (analysis.collect.control_label).
    learners = runs[~runs["reward"].astype(str).str.startswith("random")] if "reward" in runs else runs
    trained_on = sorted(learners["reward"].astype(str).unique()) if "reward" in runs else ["checker"]
    if len(trained_on) > 1:
        out.append(f"DIFFERENT TRAINING REWARDS in one table ({', '.join(trained_on)}): rows are not comparable")
    elif trained_on != ["checker"]:
        out.append(f"training reward: {trained_on[0]} (a reward model; eval accuracy is the checker's, the gold "
                   f"reward: plots/overoptimisation shows proxy vs gold)")  # fmt: skip
    models = sorted(runs["model"].astype(str).unique())
    if len(models) > 1:
        out.append(f"different models in one table: {', '.join(models)}")
    dup = runs.groupby(["algo", *KNOB_KEYS, "seed"], dropna=False).size()
    if (dup > 1).any():
        out.append(f"{int((dup > 1).sum())} seed(s) appear more than once for the same setting (runs from several sweeps?)")
    return out


def build_tables(runs: pd.DataFrame, metrics: pd.DataFrame, baseline: str | None = None,
                 target_accuracy: float | None = None) -> list[TaskTable]:
    tables = []
    for task, truns in runs.groupby("task", sort=True):
        after = after_columns(truns)
        protocol, protocol_warnings = _protocol_warnings(truns, after)
        groups = list(truns.groupby(["algo", *KNOB_KEYS], sort=True, dropna=False))
        best_means = [g["eval_best"].mean() for _, g in groups]
        if target_accuracy is not None:
            target, source = float(target_accuracy), "--target-accuracy"
        else:
            target = TARGET_FRACTION * float(np.nanmax(best_means)) if best_means else float("nan")
            source = f"{TARGET_FRACTION:g} x the highest mean best accuracy"
            if not target > 0:  # every run at 0 accuracy: "time to 0" would be meaningless
                target, source = float("nan"), "none: no run has a positive accuracy"
        rows = []
        for key, g in groups:
            row = dict(zip(["algo", *KNOB_KEYS], key))
            row["task"] = task
            row["n_seeds"] = int(g["seed"].nunique())
            row["seeds"] = ",".join(str(s) for s in sorted(g["seed"].unique()))
            for col in ("eval_final", "eval_best", "auc"):
                m, s = mean_std(g[col])
                lo, hi = bootstrap_ci(g[col])
                row |= {f"{col}_mean": m, f"{col}_std": s, f"{col}_ci_lo": lo, f"{col}_ci_hi": hi}
            hits = [time_to_target(metrics[metrics["run_dir"] == d], target) for d in g["run_dir"]]
            steps_t, tok_t, wall_t = (np.array(v, float) for v in zip(*hits))
            reached = int(np.sum(~np.isnan(tok_t)))
            row["target_reached"] = reached
            row["tokens_to_target"] = float(np.nanmedian(tok_t)) if reached else float("nan")
            row["wall_s_to_target"] = float(np.nanmedian(wall_t)) if reached else float("nan")
            row["steps_to_target"] = float(np.nanmedian(steps_t)) if reached else float("nan")
            for k in PERF_KEYS:
                row[f"{k}_s"] = float(g[f"{k}_s"].mean())
            row["step_s"] = float(g["step_s"].mean())
            row["generated_tokens"] = float(g["generated_tokens"].mean())
            row["wall_s"] = float(g["wall_s"].mean())
            row["trainable_params"] = float(g["trainable_params"].max()) if "trainable_params" in g else float("nan")
            for column in columns():  # the declared report columns (analysis/columns.py)
                row |= {name: column.combine(g[name]) if name in g else float("nan") for name in column.values}
            row["algo_defaults"] = bool(g["algo_defaults"].all()) if "algo_defaults" in g else True
            for col in after:  # scores after training: mean ± std [CI] over the seeds scored
                m, sd = mean_std(g[col]) if col in g else (float("nan"), float("nan"))
                lo, hi = bootstrap_ci(g[col]) if col in g else (float("nan"), float("nan"))
                row |= {f"{col} mean": m, f"{col} std": sd, f"{col} ci_lo": lo, f"{col} ci_hi": hi,
                        f"{col} n": int(g[col].notna().sum()) if col in g else 0}
            row["run_dirs"] = list(g["run_dir"])
            row["_finals"] = g["eval_final"].to_numpy(float)
            rows.append(row)
        df = pd.DataFrame(rows)
        if baseline is not None:
            _compare(df, baseline)
        t = TaskTable(task=str(task), rows=df.drop(columns="_finals"), target=target, target_source=source,
                      warnings=protocol_warnings + _warnings(truns), protocol=protocol, after_columns=after)
        if baseline is not None and not df["is_baseline"].any():
            t.warnings.append(f"baseline {baseline!r} has no runs on task {task}: no delta column")
        tables.append(t)
    return tables


def budget_differs(row: pd.Series, base: pd.Series) -> bool:
    """True when a row did not run on the baseline's budget: another budget kind or limit (for
    step budgets also another batch shape), another response cap, or generated tokens more
    than TOKEN_TOLERANCE away (extra generation, e.g. a greedy pass, under a step budget)."""
    keys = ["budget", "max_response_tokens", "warm_start"]
    steps_budget = str(base["budget"]).startswith("steps=")
    if steps_budget:
        keys += ["steps", "prompts_per_step", "samples_per_prompt"]
    if any(row[k] != base[k] for k in keys):
        return True
    if not steps_budget:  # a tokens/wall budget charges all generation to the same limit
        return False
    tokens, base_tokens = float(row["generated_tokens"]), float(base["generated_tokens"])
    return base_tokens > 0 and abs(tokens - base_tokens) > TOKEN_TOLERANCE * base_tokens


# A baseline algorithm's reference setting: full fine-tuning, lockstep (both matched across algorithms:
# LoRA rows with LoRA rows), then its registered defaults (no variant label, every algo.* key at its default).
SETTINGS = (("tuning", "full"), ("pipeline", "sync"))
OWN_SETTINGS = (("variant", ""), ("algo_defaults", True))


def baseline_rows(df: pd.DataFrame, baseline: str) -> pd.Series:
    """The baseline algorithm's rows; when it ran both fully fine-tuned and with LoRA (or both in
    lockstep and pipelined, or at its defaults and with a changed knob), the full fine-tuning (sync,
    default) rows, so its other rows get a difference to them."""
    is_base = df["algo"] == baseline
    for col, reference in (*SETTINGS, *OWN_SETTINGS):  # each filter only where it leaves rows
        if col in df and (is_base & (df[col] == reference)).any():
            is_base &= df[col] == reference
    return is_base


def _compare(df: pd.DataFrame, baseline: str) -> None:
    """Columns against the baseline: delta, its 95% CI, Welch p, Holm-corrected p, MDE, budget flag."""
    df["is_baseline"] = baseline_rows(df, baseline)
    base = df[df["is_baseline"]]
    for col in ("delta", "delta_ci_lo", "delta_ci_hi", "p_value", "p_holm", "mde"):
        df[col] = np.nan
    df["budget_differs"] = False
    df["baseline_row"] = np.nan
    if base.empty:
        return
    of_baseline_algo = df[df["algo"] == baseline]
    for i, r in df.iterrows():
        if r["is_baseline"]:
            continue
        # Another algorithm is compared with the baseline algorithm in the same setting (LoRA with
        # LoRA, async with async) when there is such a row; the baseline algorithm's own LoRA or
        # pipelined rows with its full-fine-tuning, sync ones.
        cands = base
        if r["algo"] != baseline:  # all settings equal, else all but the last (e.g. LoRA sync for LoRA async)
            for n_equal in range(len(SETTINGS), 0, -1):
                same = of_baseline_algo.drop(index=i, errors="ignore")
                for col, _ in SETTINGS[:n_equal]:
                    if col in df:
                        same = same[same[col] == r[col]]
                if len(same):
                    cands = same
                    break
        # Then the reference rows among them (the baseline algorithm at its defaults), if any.
        if cands["is_baseline"].any():
            cands = cands[cands["is_baseline"]]
        # Then the row with the same budget and warm start, else the first one.
        same = cands[(cands[["budget", "warm_start"]] == r[["budget", "warm_start"]]).all(axis=1)]
        b = (same if len(same) else cands).iloc[0]
        df.at[i, "budget_differs"] = budget_differs(r, b)
        if r["warm_start"] != b["warm_start"]:
            continue  # other starting weights: no difference is shown, none enters Holm
        df.at[i, "baseline_row"] = b.name  # the row compared with (the compute fit's differences use it too)
        p, lo, hi = welch(r["_finals"], b["_finals"])
        df.at[i, "delta"] = r["eval_final_mean"] - b["eval_final_mean"]
        df.at[i, "delta_ci_lo"], df.at[i, "delta_ci_hi"], df.at[i, "p_value"] = lo, hi, p
        df.at[i, "mde"] = mde(r["_finals"], b["_finals"])
    df["p_holm"] = holm(df["p_value"].to_numpy(float))
