"""harness report: collection, statistics, tables in every format, robustness, figures (fake run dirs)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fake_runs import make_run, make_sweep
from omegaconf import OmegaConf
from rich.console import Console

from analysis import report
from analysis.collect import auc, collect
from analysis.plots import algo_color, palette
from analysis.stats import bootstrap_ci, holm, mde, mean_std, welch
from analysis.tables import build_tables, time_to_target


def run_report(argv):
    buf = io.StringIO()
    rc = report.main(argv, console=Console(file=buf, width=250, color_system=None))
    return rc, buf.getvalue()


# ----------------------------------------------------------------------------- statistics
def test_bootstrap_ci_is_deterministic_and_brackets_the_mean():
    x = [0.4, 0.5, 0.55, 0.6]
    lo, hi = bootstrap_ci(x)
    assert (lo, hi) == bootstrap_ci(x)
    assert lo <= np.mean(x) <= hi and lo >= min(x) and hi <= max(x)
    assert bootstrap_ci([0.3]) == (0.3, 0.3)
    assert mean_std([0.3]) == (0.3, 0.0)
    assert np.isnan(bootstrap_ci([])[0])


def test_welch_holm_and_mde_by_hand():
    from scipy.stats import t as student_t

    # a = [1, 2, 3] (mean 2, var 1), b = [4, 6, 8] (mean 6, var 4): se = sqrt(1/3 + 4/3),
    # Welch-Satterthwaite df = (5/3)^2 / ((1/3)^2 / 2 + (4/3)^2 / 2) = 50/17.
    se, df = (5 / 3) ** 0.5, (5 / 3) ** 2 / ((1 / 3) ** 2 / 2 + (4 / 3) ** 2 / 2)
    assert df == pytest.approx(50 / 17)
    p, lo, hi = welch([1, 2, 3], [4, 6, 8])
    assert p == pytest.approx(2 * student_t.sf(4 / se, df))
    half = student_t.ppf(0.975, df) * se
    assert (lo, hi) == (pytest.approx(-4 - half), pytest.approx(-4 + half))
    # Two seeds a side can reach significance (the permutation test could not go below 1/3).
    assert welch([1.0, 1.1], [0.0, 0.1])[0] < 0.01
    assert all(np.isnan(welch([0.5], [0.4, 0.6])))  # one seed: no test
    # Holm: sorted p 0.01, 0.03, 0.04 -> x3, x2, x1 = 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06.
    assert holm([0.01, 0.04, 0.03, np.nan])[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert np.isnan(holm([0.01, np.nan])[1])
    # MDE: 5 vs 5 seeds at alpha 0.05 / power 0.8 detect d = 2.024 (two-sample t power tables),
    # times the pooled seed standard deviation (here 0.05).
    a, b = 0.3 + 0.05 * np.array([-1.2649, -0.6325, 0, 0.6325, 1.2649]), 0.2 + 0.05 * np.array([-1.2649, -0.6325, 0, 0.6325, 1.2649])
    assert a.std(ddof=1) == pytest.approx(0.05, rel=1e-4)
    assert mde(a, b) == pytest.approx(2.0244 * 0.05, rel=1e-3)
    assert np.isnan(mde([0.1], [0.2, 0.3]))


def test_auc_and_time_to_target():
    assert auc(np.array([0, 5, 10]), np.array([0.0, 0.5, 1.0])) == pytest.approx(0.5)
    assert auc(np.array([0]), np.array([0.3])) == pytest.approx(0.3)
    m = pd.DataFrame({"step": [0, 5, 10], "eval_acc": [0.1, 0.4, 0.6],
                      "budget/generated_tokens": [0, 500, 1000], "budget/wall_s": [0, 2.0, 4.0]})
    assert time_to_target(m, 0.4) == (5.0, 500.0, 2.0)
    assert np.isnan(time_to_target(m, 0.9)[1])


# ----------------------------------------------------------------------------- collection
def test_knobs_come_from_the_runs_own_description(tmp_path):
    """run.json's ``algorithm`` (Algorithm.describe at run time) wins over the class metadata, so a
    config switch (grpo's scale_by_std) shows without analysis knowing any algorithm's fields."""
    import algorithms

    plain = make_run(tmp_path, "grpo", seed=0)
    switched = make_run(tmp_path, "grpo", seed=1, extra_algo={"scale_by_std": False})
    described = algorithms.build(OmegaConf.create({"name": "grpo", "scale_by_std": False})).describe()
    info = json.loads((switched / "run.json").read_text())
    (switched / "run.json").write_text(json.dumps({**info, "algorithm": described}))
    runs = collect([tmp_path]).runs.set_index("seed")
    assert (runs.at[0, "std_norm"], runs.at[1, "std_norm"]) == ("group std", "none")
    assert runs.at[1, "kl_placement"] == "loss" and plain.exists()


def test_collect_tidy_frames(tmp_path):
    make_sweep(tmp_path, algos=("grpo", "rloo"), seeds=(0, 1, 2), steps=10, eval_every=5)
    col = collect([tmp_path])
    assert col.skipped == []
    assert len(col.runs) == 6
    assert len(col.metrics) == 6 * 11  # steps 0..10
    r = col.runs.set_index(["algo", "seed"]).loc[("grpo", 1)]
    assert r["eval_final"] == pytest.approx(0.62) and r["eval_first"] == pytest.approx(0.1)
    assert r["loss_agg"] == "seq_mean_token_mean" and r["std_norm"] == "group std"  # the class's metadata
    assert r["kl_placement"] == "loss" and r["kl_coef"] == 0.04 and r["checker"] == "arith@1"
    assert col.runs.set_index(["algo", "seed"]).loc[("rloo", 0), "kl_placement"] == "none"  # kl_coef 0
    assert r["rollout_s"] == pytest.approx(0.25) and r["step_s"] == pytest.approx(0.5)
    ev = col.metrics[col.metrics["eval_acc"].notna()]
    assert sorted(ev["step"].unique()) == [0, 5, 10]
    assert (col.metrics.loc[col.metrics["step"] == 0, "budget/generated_tokens"] == 0).all()


def test_broken_and_partial_runs_are_skipped_with_reason(tmp_path):
    make_sweep(tmp_path / "ok", algos=("grpo",), seeds=(0, 1))
    make_run(tmp_path, algo="grpo", seed=7, status="running", name="partial")
    bad = make_run(tmp_path, algo="grpo", seed=8, name="bad_runjson")
    (bad / "run.json").write_text("{not json")
    nom = make_run(tmp_path, algo="grpo", seed=9, name="no_metrics")
    (nom / "metrics.jsonl").unlink()
    mid = make_run(tmp_path, algo="grpo", seed=10, name="corrupt_metrics")
    lines = (mid / "metrics.jsonl").read_text().splitlines()
    lines[3] = lines[3][:20]
    (mid / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    torn = make_run(tmp_path, algo="grpo", seed=11, name="torn_last_line")
    (torn / "metrics.jsonl").write_text((torn / "metrics.jsonl").read_text() + '{"step": 11, "reward')
    ev = make_run(tmp_path, algo="grpo", seed=12, name="eval_run")
    info = json.loads((ev / "run.json").read_text())
    (ev / "run.json").write_text(json.dumps(info | {"kind": "eval"}))
    (tmp_path / "only_config").mkdir()
    (tmp_path / "only_config" / "config.yaml").write_text("algo: {name: grpo}\n")
    noeval = make_run(tmp_path, algo="grpo", seed=13, name="no_eval")
    (noeval / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.1}\n')
    badcfg = make_run(tmp_path, algo="grpo", seed=14, name="bad_config")
    (badcfg / "config.yaml").write_text("algo: [unclosed\n")

    col = collect([tmp_path, tmp_path / "missing_dir"])
    reasons = {k.rsplit("/", 1)[-1]: v for k, v in col.skipped}
    assert set(col.runs["seed"]) == {0, 1, 11}  # the torn last line is tolerated
    assert "partial" in reasons["partial"] and "running" in reasons["partial"]
    assert "corrupt run.json" in reasons["bad_runjson"]
    assert "no metrics.jsonl" in reasons["no_metrics"]
    assert "corrupt metrics.jsonl line 4" in reasons["corrupt_metrics"]
    assert "eval run" in reasons["eval_run"]
    assert "no run.json" in reasons["only_config"]
    assert "no eval lines" in reasons["no_eval"]
    assert "corrupt config.yaml" in reasons["bad_config"]
    assert "does not exist" in reasons["missing_dir"]

    rc, out = run_report([str(tmp_path), "--no-plots"])
    assert rc == 0
    assert "skipped" in out and "bad_runjson" in out
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Skipped run directories" in md and "corrupt_metrics" in md


def test_no_runs_and_bad_arguments(tmp_path):
    make_run(tmp_path, status="running")
    rc, out = run_report([str(tmp_path)])
    assert rc == 1 and "no finished training runs" in out
    make_run(tmp_path, name="done")
    assert run_report([str(tmp_path), "--baseline", "nope", "--no-plots"])[0] == 2
    assert run_report([str(tmp_path), "--format", "docx"])[0] == 2
    assert run_report([]) == (2, "")


# ----------------------------------------------------------------------------- tables and formats
def test_report_formats_baseline_and_bold(tmp_path):
    make_sweep(tmp_path / "sweep", algos=("grpo", "rloo", "ppo"), seeds=(0, 1, 2))
    out = tmp_path / "out"
    rc, console = run_report([str(tmp_path / "sweep"), "--baseline", "rloo", "--out", str(out), "--no-plots"])
    assert rc == 0
    for f in ("runs.parquet", "metrics.parquet", "report.md", "summary.csv", "table.tex"):
        assert (out / f).exists() and str(out / f) in console
    assert len(pd.read_parquet(out / "runs.parquet")) == 9
    assert "WARNING" not in console  # same budget, same checker

    csv = pd.read_csv(out / "summary.csv", comment="#").set_index("algo")
    assert csv.loc["grpo", "n_seeds"] == 3
    assert csv.loc["grpo", "eval_final_mean"] == pytest.approx(0.62)
    assert csv.loc["grpo", "delta"] == pytest.approx(0.1)
    # grpo 0.60/0.62/0.64 vs rloo 0.50/0.52/0.54: Welch t = 0.1 / sqrt(2 x 0.0004 / 3), df = 4
    from scipy.stats import t as student_t
    assert csv.loc["grpo", "p_value"] == pytest.approx(2 * student_t.sf(0.1 / (2 * 0.0004 / 3) ** 0.5, 4))
    assert csv.loc["grpo", "p_holm"] == pytest.approx(min(1.0, 2 * csv["p_value"].min()))  # smallest of 2 p-values
    assert csv.loc["grpo", "mde"] == pytest.approx(0.02 * 3.0709, rel=1e-3)  # d for 3 vs 3 seeds (power tables), sd 0.02
    assert not csv.loc["grpo", "budget_differs"]
    assert np.isnan(csv.loc["rloo", "delta"])
    assert csv.loc["grpo", "eval_final_ci_lo"] <= 0.62 <= csv.loc["grpo", "eval_final_ci_hi"]
    # target = 0.9 x best mean best accuracy (grpo 0.62) = 0.558; grpo reaches it at step 10 only
    assert csv.loc["grpo", "target"] == pytest.approx(0.558)
    assert csv.loc["grpo", "target_reached"] == 3 and csv.loc["grpo", "tokens_to_target"] == 4000
    assert csv.loc["ppo", "target_reached"] == 0

    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| grpo"))
    assert "**0.620 ± 0.020" in row  # best final accuracy in bold
    assert "+0.100 [" in row and "seq_mean_token_mean" in row and "loss k3 0.04" in row
    assert "arith@1" in row and "10 st x 4x8 seq" in row and "tiny" in row
    assert "Δ final vs rloo [95% CI]" in md and "Welch" in md and "Holm" in md and "MDE" in md
    tex = (out / "table.tex").read_text()
    assert r"\toprule" in tex and r"\bottomrule" in tex and r"\textbf{0.620 $\pm$ 0.020" in tex
    assert r"seq\_mean\_token\_mean" in tex
    assert "Δ final vs rloo" in console and "0.620 ± 0.020" in console


def test_mixed_budgets_and_checkers_warn_in_every_format(tmp_path):
    make_run(tmp_path, algo="grpo", seed=0, steps=10)
    make_run(tmp_path, algo="grpo", seed=1, steps=10)
    make_run(tmp_path, algo="rloo", seed=0, steps=20, checker="arith@2", max_response_tokens=32)
    rc, console = run_report([str(tmp_path), "--no-plots"])
    assert rc == 0
    rep = tmp_path / "report"
    texts = {"console": console, "md": (rep / "report.md").read_text(), "csv": (rep / "summary.csv").read_text(),
             "tex": (rep / "table.tex").read_text()}
    for fmt, text in texts.items():
        assert "mixed checker versions" in text and "arith@1, arith@2" in text, fmt
        assert "mixed budgets: trainer.steps differs (10, 20)" in text, fmt
        assert "rollout.max_response_tokens differs" in text, fmt
    assert "> **WARNING:**" in texts["md"] and "# WARNING:" in texts["csv"] and r"\textbf{Warning:}" in texts["tex"]


def test_token_budget_is_shown_and_mixed_budget_kinds_are_flagged(tmp_path):
    make_run(tmp_path, algo="grpo", name="steps")
    make_run(tmp_path, algo="rloo", name="tokens", trainer={"budget": "tokens", "budget_tokens": 4000})
    rc, _ = run_report([str(tmp_path), "--no-plots"])
    assert rc == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "mixed budgets: trainer.budget differs (steps=10, tokens=4000)" in text
    assert "tokens=4000, <= 10 st x" in text  # the row states what ended the run


def test_variants_and_tasks_get_their_own_rows(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path, algo="grpo", seed=seed, name=f"kl0_{seed}", extra_algo={"kl_coef": 0.0})
        make_run(tmp_path, algo="grpo", seed=seed, name=f"kl04_{seed}")
        make_run(tmp_path, algo="grpo", seed=seed, name=f"eps_{seed}", extra_algo={"clip_high": 0.28})
        make_run(tmp_path, algo="grpo", seed=seed, task="gsm8k", name=f"gsm_{seed}")
    col = collect([tmp_path])
    tables = build_tables(col.runs, col.metrics, target_accuracy=0.3)
    assert [t.task for t in tables] == ["arith", "gsm8k"]
    arith = tables[0].rows
    assert len(arith) == 3 and set(arith["n_seeds"]) == {2}
    assert set(arith["variant"]) == {"", "algo.clip_high=0.28"}  # grpo's default 0.2 is not a variant
    assert set(arith["kl_placement"]) == {"none", "loss"}
    assert tables[0].target == 0.3 and tables[0].target_source == "--target-accuracy"


def test_a_random_reward_control_is_a_marked_row_compared_with_the_baseline(tmp_path):
    """grpo trained on a random reward (reward.source=random) is its own row, labelled as a control, with a
    difference to grpo at its defaults (which stays the baseline row) and a note saying what a control is."""
    for seed in (0, 1, 2):
        make_run(tmp_path, algo="grpo", seed=seed, final_acc=0.6 + 0.01 * seed, reward={"source": "checker"})
        make_run(tmp_path, algo="grpo", seed=seed, final_acc=0.1 + 0.01 * seed, name=f"control,seed={seed}",
                 reward={"source": "random", "random_rate": 0.3})
    rc, out = run_report([str(tmp_path), "--baseline", "grpo", "--format", "md"])
    assert rc == 0
    md = (tmp_path / "report" / "report.md").read_text()
    control = next(line for line in md.splitlines() if line.startswith("| grpo [control: random reward p=0.3]"))
    assert "-0.500" in control  # its difference to grpo's 0.61
    assert next(line for line in md.splitlines() if line.startswith("| grpo |")).count("baseline") == 1
    assert "control: a run trained on a random reward" in md
    assert "DIFFERENT TRAINING REWARDS" not in out  # a control differs on purpose


# ----------------------------------------------------------------------------- figures
def test_colours_are_fixed_per_algorithm():
    assert algo_color("grpo") == palette(["rloo", "grpo"])["grpo"] == palette(["grpo", "zzz"])["grpo"]
    assert algo_color("my_plugin_algo") == algo_color("my_plugin_algo")
    assert len({algo_color(a) for a in ("grpo", "dr_grpo", "dapo", "ppo", "remax", "rloo", "reinforce_pp",
                                        "reinforce_pp_baseline", "prime", "gspo", "cispo")}) == 11


def test_plots_written_png_and_pdf(tmp_path):
    make_sweep(tmp_path, algos=("grpo", "rloo"), seeds=(0, 1), steps=6, eval_every=3)
    rc, out = run_report([str(tmp_path), "--format", "md"])
    assert rc == 0
    plots = tmp_path / "report" / "plots"
    for stem in ("accuracy_vs_step", "accuracy_vs_tokens", "accuracy_vs_wall", "final_accuracy",
                 "response_length", "entropy", "length_correct_vs_tokens", "length_incorrect_vs_tokens",
                 "length_by_correctness_vs_tokens",
                 "entropy_vs_tokens", "clipfrac_vs_tokens", "truncated_vs_tokens"):
        for ext in ("png", "pdf"):
            assert (plots / f"{stem}.{ext}").stat().st_size > 1000, (stem, ext)
            assert str(plots / f"{stem}.{ext}") in out
    assert not (tmp_path / "report" / "summary.csv").exists()  # --format md only


def test_overoptimisation_figure_only_for_reward_model_runs(tmp_path):
    """Runs trained on a reward model get the proxy-vs-gold figure against KL from the start."""
    checker_runs, rm_runs = tmp_path / "checker", tmp_path / "rm"
    make_sweep(checker_runs, algos=("grpo",), seeds=(0,), steps=6, eval_every=3)
    make_sweep(rm_runs, algos=("grpo", "ppo"), seeds=(0, 1), steps=12, eval_every=3)
    for metrics_file in rm_runs.glob("*/metrics.jsonl"):
        rows = [json.loads(line) for line in metrics_file.read_text().splitlines()]
        for r in rows[1:]:  # the proxy keeps rising, the gold turns down past KL 4
            kl = 0.5 * r["step"]
            r |= {"kl/from_start": kl, "reward/model_mean": kl, "reward/gold_mean": 0.1 + 0.05 * kl - 0.01 * kl**2}
        metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_report([str(checker_runs), "--format", "md"])[0] == 0
    assert not list((checker_runs / "report" / "plots").glob("overoptimisation*"))
    rc, out = run_report([str(rm_runs), "--format", "md"])
    assert rc == 0
    for ext in ("png", "pdf"):
        figure = rm_runs / "report" / "plots" / f"overoptimisation.{ext}"
        assert figure.stat().st_size > 1000 and str(figure) in out


def test_no_target_when_every_accuracy_is_zero(tmp_path):
    make_run(tmp_path, final_acc=0.0, start_acc=0.0)
    col = collect([tmp_path])
    (t,) = build_tables(col.runs, col.metrics)
    assert np.isnan(t.target) and t.rows.loc[0, "target_reached"] == 0
    rc, out = run_report([str(tmp_path), "--no-plots"])
    assert rc == 0 and "target accuracy n/a" in out


def test_rows_off_the_baselines_budget_are_marked(tmp_path):
    # A step budget with 16 samples per prompt (DAPO's default) is not grpo's budget: marked †.
    make_sweep(tmp_path, algos=("grpo", "rloo"), seeds=(0, 1))
    for seed in (0, 1):
        make_run(tmp_path, algo="dapo", seed=seed, extra_algo={"samples_per_prompt": 16}, tokens_per_step=800)
    rc, console = run_report([str(tmp_path), "--baseline", "grpo", "--no-plots"])
    assert rc == 0
    csv = pd.read_csv(tmp_path / "report" / "summary.csv", comment="#").set_index("algo")
    assert csv.loc["dapo", "budget_differs"] and not csv.loc["rloo", "budget_differs"]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| dapo † |" in md and "| rloo |" in md and "†: this row's budget differs" in md


def test_equal_token_budgets_are_not_marked(tmp_path):
    tokens = {"budget": "tokens", "budget_tokens": 4000, "steps": 1000}
    for seed in (0, 1):
        make_run(tmp_path, algo="grpo", seed=seed, trainer=tokens)
        # twice the tokens per step, half the steps: the same token budget
        make_run(tmp_path, algo="dapo", seed=seed, steps=5, tokens_per_step=800, trainer=tokens,
                 extra_algo={"samples_per_prompt": 16})
    rc, _ = run_report([str(tmp_path), "--baseline", "grpo", "--no-plots"])
    csv = pd.read_csv(tmp_path / "report" / "summary.csv", comment="#").set_index("algo")
    assert rc == 0 and not csv.loc["dapo", "budget_differs"]


def test_runs_from_different_warm_starts_are_never_pooled(tmp_path):
    make_run(tmp_path, algo="grpo", seed=0, warm_start="aa" * 32)
    make_run(tmp_path, algo="grpo", seed=1, warm_start="bb" * 32)
    rc, console = run_report([str(tmp_path), "--no-plots"])
    assert rc == 0 and "DIFFERENT WARM STARTS" in console
    csv = pd.read_csv(tmp_path / "report" / "summary.csv", comment="#")
    assert len(csv) == 2 and set(csv["warm_start"]) == {"aa" * 6, "bb" * 6} and set(csv["n_seeds"]) == {1}


def test_one_seed_shows_a_value_without_spread():
    from analysis.render import fmt_stat

    one = {"n_seeds": 1, "x_mean": 0.25, "x_std": 0.0, "x_ci_lo": 0.25, "x_ci_hi": 0.25}
    assert fmt_stat(one, "x") == "0.250 (1 seed)"
    two = {**one, "n_seeds": 2, "x_std": 0.05, "x_ci_lo": 0.2, "x_ci_hi": 0.3}
    assert fmt_stat(two, "x") == "0.250 ± 0.050 [0.200, 0.300]"


def test_lora_and_full_fine_tuning_side_by_side(tmp_path):
    """One algorithm fully fine-tuned and with LoRA: two rows, the tuning column names the settings
    and trained parameters, and the LoRA row is compared with the full fine-tuning baseline."""
    for seed in (0, 1, 2):
        make_run(tmp_path, algo="grpo", seed=seed, name=f"full_{seed}", final_acc=0.5 + 0.01 * seed)
        make_run(tmp_path, algo="grpo", seed=seed, name=f"lora_{seed}", final_acc=0.4 + 0.01 * seed, lora_rank=8)
    make_run(tmp_path, algo="rloo", seed=0, name="rloo_old", legacy=True)  # written before model.lora existed
    make_run(tmp_path, algo="rloo", seed=1, name="rloo_new")
    make_run(tmp_path, algo="rloo", seed=0, name="rloo_lora", lora_rank=8)
    rc, console = run_report([str(tmp_path), "--baseline", "grpo", "--no-plots"])
    assert rc == 0
    csv = pd.read_csv(tmp_path / "report" / "summary.csv", comment="#").set_index("tuning", drop=False)
    rows = csv[csv["algo"] == "grpo"]
    assert set(rows["tuning"]) == {"full", "lora r8 a16"}
    assert rows.loc["lora r8 a16", "trainable_params"] == 45056
    assert rows.loc["lora r8 a16", "delta"] == pytest.approx(-0.1)
    assert np.isnan(rows.loc["full", "delta"])  # the baseline itself
    rloo = csv[csv["algo"] == "rloo"].set_index("tuning")
    assert len(rloo.loc[["full"]]) == 1 and rloo.loc["full", "n_seeds"] == 2, rloo[["variant", "n_seeds"]]  # old pools with new
    # rloo's LoRA row is compared with grpo's LoRA row (same tuning), its full row with grpo's full row.
    assert rloo.loc["lora r8 a16", "delta"] == pytest.approx(0.5 - 0.41)  # vs grpo's LoRA mean, not its full 0.51
    assert rloo.loc["full", "delta"] == pytest.approx(0.5 - 0.51)
    assert list(csv[csv["is_baseline"]]["tuning"]) == ["full"]
    assert "lora r8 a16 (45.1k trained)" in console
    assert "grpo [model.lora.rank=8]" in console  # the variant label is text, not a rich style tag
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| tuning | warm start |" in md and "| lora r8 a16 (45.1k trained) |" in md


def test_environment_runs_get_their_own_rows_and_tool_columns(tmp_path):
    """Runs with an environment are grouped apart from single-turn runs of the same algorithm; the
    env column shows the final eval's tool-success fraction and turns per episode."""
    for seed in (0, 1):
        make_run(tmp_path, algo="grpo", seed=seed, name=f"plain_{seed}", final_acc=0.3)
        make_run(tmp_path, algo="grpo", seed=seed, name=f"calc_{seed}", final_acc=0.9, env="calculator")
    rc, _ = run_report([str(tmp_path), "--no-plots"])
    assert rc == 0
    csv = pd.read_csv(tmp_path / "report" / "summary.csv", comment="#").set_index("env")
    assert set(csv.index) == {"none", "calculator <=4 turns"}
    assert csv.loc["calculator <=4 turns", "tool_success_final"] == pytest.approx(1.0)
    assert csv.loc["calculator <=4 turns", "turns_final"] == pytest.approx(2.0)
    assert np.isnan(csv.loc["none", "tool_success_final"])
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| env (final tool success, turns) |" in md and "| calculator <=4 turns (1.00, 2.0) |" in md and "| none |" in md


def test_pipelined_rows_are_compared_in_their_own_setting(tmp_path):
    """A pipelined row of the baseline algorithm gets its difference to the sync row; another
    algorithm's async LoRA row, with no grpo async LoRA row, falls back to grpo's LoRA sync row."""
    for seed in (0, 1):
        make_run(tmp_path, algo="grpo", seed=seed, name=f"sync_{seed}", final_acc=0.5)
        make_run(tmp_path, algo="grpo", seed=seed, name=f"async_{seed}", final_acc=0.6, pipeline="async")
        make_run(tmp_path, algo="grpo", seed=seed, name=f"lora_{seed}", final_acc=0.3, lora_rank=8)
        make_run(tmp_path, algo="rloo", seed=seed, name=f"rloo_{seed}", final_acc=0.4, lora_rank=8, pipeline="async")
    rc, console = run_report([str(tmp_path), "--baseline", "grpo", "--no-plots"])
    assert rc == 0
    csv = pd.read_csv(tmp_path / "report" / "summary.csv", comment="#")
    grpo = csv[csv["algo"] == "grpo"].set_index(["tuning", "pipeline"])
    assert grpo.loc[("full", "async K=2 (old_logp behaviour)"), "delta"] == pytest.approx(0.1)
    assert grpo.loc[("full", "async K=2 (old_logp behaviour)"), "staleness_mean"] == pytest.approx(1.0)
    assert list(csv[csv["is_baseline"]]["pipeline"]) == ["sync"]
    rloo = csv[csv["algo"] == "rloo"].iloc[0]
    assert rloo["delta"] == pytest.approx(0.4 - 0.3)  # vs grpo LoRA sync, not grpo full sync (0.5)
    assert "async K=2 (old_logp behaviour); staleness 1.00" in console


def test_the_mismatch_column_shows_the_gap_ess_and_rejected_tokens_where_runs_logged_them(tmp_path):
    """Rows whose runs logged the rollout-training mismatch show its means over steps and seeds; a row without
    shows '-', and a report where no run logged any has no such column."""
    for seed in (0, 1):
        make_run(tmp_path, algo="grpo", seed=seed, name=f"plain_{seed}", final_acc=0.5)
        make_run(tmp_path, algo="rloo", seed=seed, name=f"quant_{seed}", final_acc=0.4,
                 mismatch=(0.004 + 0.002 * seed, 0.9, 0.1))  # fmt: skip
    rc, console = run_report([str(tmp_path), "--baseline", "grpo", "--no-plots"])
    assert rc == 0
    csv = pd.read_csv(tmp_path / "report" / "summary.csv", comment="#").set_index("algo")
    assert csv.loc["rloo", "logp_gap_mean"] == pytest.approx(0.005) and csv.loc["rloo", "mismatch_ess"] == pytest.approx(0.9)
    assert csv.loc["rloo", "rejected_frac"] == pytest.approx(0.1) and np.isnan(csv.loc["grpo", "logp_gap_mean"])
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| mismatch (gap/token, ESS, rejected tokens) |" in md and "| gap 0.0050, ESS 0.900, rejected 0.100 |" in md
    plain = tmp_path / "plain_only"
    make_run(plain, algo="grpo", seed=0, name="a")
    make_run(plain, algo="rloo", seed=0, name="b")
    assert run_report([str(plain), "--no-plots"])[0] == 0
    assert "mismatch (gap" not in (plain / "report" / "report.md").read_text()


def test_a_knob_changed_on_the_baseline_algorithm_is_compared_with_its_defaults(tmp_path):
    """`harness sweep --preset reasoning algo=grpo algo.clip_high=0.28` beside the preset's grpo runs:
    the changed-knob row is labelled by it and compared with grpo at its defaults (the one baseline
    row, named plainly); another algorithm is compared with those defaults too."""
    for seed in (0, 1, 2):
        make_run(tmp_path, algo="grpo", seed=seed, name=f"grpo_{seed}", final_acc=0.5 + 0.01 * seed)
        make_run(tmp_path, algo="grpo", seed=seed, name=f"high_{seed}", final_acc=0.4 + 0.01 * seed,
                 extra_algo={"clip_high": 0.28})
        make_run(tmp_path, algo="grpo", seed=seed, name=f"nokl_{seed}", final_acc=0.45 + 0.01 * seed,
                 extra_algo={"kl_coef": 0.0})  # a shown knob (the KL column), not a variant label
        make_run(tmp_path, algo="rloo", seed=seed, name=f"rloo_{seed}", final_acc=0.3 + 0.01 * seed)
        make_run(tmp_path, algo="rloo", seed=seed, name=f"rloo_high_{seed}", final_acc=0.2 + 0.01 * seed,
                 extra_algo={"clip_high": 0.28})
    rc, console = run_report([str(tmp_path), "--baseline", "grpo", "--no-plots"])
    assert rc == 0
    csv = pd.read_csv(tmp_path / "report" / "summary.csv", comment="#").fillna({"variant": ""})
    rloo = csv[csv["algo"] == "rloo"].set_index("variant")  # both compared with grpo at its defaults
    assert rloo.loc["", "delta"] == pytest.approx(-0.2) and rloo.loc["algo.clip_high=0.28", "delta"] == pytest.approx(-0.3)
    grpo = csv[csv["algo"] == "grpo"].set_index(["variant", "kl_coef"])
    assert list(grpo[grpo["is_baseline"]].index) == [("", 0.04)]
    assert grpo.loc[("algo.clip_high=0.28", 0.04), "delta"] == pytest.approx(-0.1)
    assert grpo.loc[("", 0.0), "delta"] == pytest.approx(-0.05)
    assert "grpo [algo.clip_high=0.28]" in console


def test_report_of_some_algorithms_only(tmp_path):
    """--algos keeps the named algorithms' runs (table and plots); a name without runs is an error."""
    for algo in ("grpo", "rloo", "ppo"):
        make_run(tmp_path, algo=algo, seed=0, name=algo)
    rc, _ = run_report([str(tmp_path), "--algos", "grpo,ppo", "--baseline", "grpo", "--no-plots"])
    assert rc == 0
    csv = pd.read_csv(tmp_path / "report" / "summary.csv", comment="#")
    assert sorted(csv["algo"]) == ["grpo", "ppo"]
    rc, console = run_report([str(tmp_path), "--algos", "grpo,remax", "--no-plots"])
    assert rc == 2 and "--algos remax: no runs" in console


def test_curve_labels_keep_settings_that_differ_by_a_table_knob():
    """Two KL coefficients of one algorithm are two curves (they pooled into one before), named by
    the coefficient; an algorithm run one way keeps its plain name."""
    from analysis.plots import _settings

    runs = pd.DataFrame({"task": ["t"] * 3, "algo": ["grpo", "grpo", "rloo"], "variant": ["", "", ""],
                         "kl_coef": [0.04, 0.0, 0.0], "kl_placement": ["loss", "none", "none"],
                         "warm_start": ["a"] * 3})  # fmt: skip
    assert list(_settings(runs)) == ["grpo KL 0.04", "grpo KL 0", "rloo"]


def test_reasoning_findings_script_reads_a_report(tmp_path, capsys):
    """scripts/reasoning_findings.py (docs/reasoning.md's numbers): each comparison with both sides
    present prints means, CIs and the difference; a missing side is named and skipped."""
    import importlib.util

    for seed in (0, 1, 2):
        make_run(tmp_path, algo="grpo", seed=seed, name=f"grpo_{seed}", final_acc=0.5 + 0.01 * seed)
        make_run(tmp_path, algo="dr_grpo", seed=seed, name=f"dr_{seed}", final_acc=0.4 + 0.01 * seed)
    assert run_report([str(tmp_path), "--no-plots"])[0] == 0
    path = Path(__file__).resolve().parents[2] / "scripts" / "reasoning_findings.py"
    spec = importlib.util.spec_from_file_location("reasoning_findings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(str(tmp_path / "report")) == 0
    out = capsys.readouterr().out
    assert "length normalisation: final accuracy (eval_final): grpo KL 0.04 0.510" in out
    assert "dr_grpo 0.410" in out and "difference -0.100" in out
    assert "clip-higher: policy entropy: no runs of dapo [algo.clip_high=0.2] (skipped)" in out
