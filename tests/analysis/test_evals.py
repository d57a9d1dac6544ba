"""The report's columns from evaluations after training (RUN/evals/, harness eval SWEEP_DIR), and protocol labels."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from fake_runs import make_run
from rich.console import Console

from analysis import report
from analysis.collect import collect
from analysis.stats import bootstrap_ci


def make_eval(run: Path, step: int, samples: int, scores: dict[str, float], prompts: int = 1000,
              temperature: float = 1.0, protocols: list[str] | None = None, status: str = "finished") -> Path:
    """An eval run directory as harness eval SWEEP_DIR writes it; ``scores``: metric -> value (accuracy, maj@K...)."""
    temperature = 0.0 if samples == 1 else temperature
    d = run / "evals" / f"step_{step:07d}" / f"samples={samples},T={temperature:g}"
    d.mkdir(parents=True)
    line = {"step": 0, "eval/arith/prompts": prompts}
    for k, v in scores.items():
        line |= {f"eval/arith/{k}": v, f"eval/arith/{k}_ci_low": v - 0.02, f"eval/arith/{k}_ci_high": v + 0.02}
    (d / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    (d / "run.json").write_text(json.dumps({
        "status": status, "kind": "eval", "samples": samples, "temperature": temperature, "eval_prompts": prompts,
        "eval_metric": "eval/arith/accuracy", "protocols": protocols}))
    return d


def _runs(tmp_path, finals=((0.50, 0.52), (0.40, 0.46))):
    runs = {}
    for algo, accs in zip(("grpo", "rloo"), finals):
        for seed, acc in enumerate(accs):
            runs[algo, seed] = make_run(tmp_path, algo, seed=seed, final_acc=acc)
    return runs


def run_report(argv):
    buf = io.StringIO()
    rc = report.main(argv, console=Console(file=buf, width=400, color_system=None))
    return rc, buf.getvalue()


def test_final_checkpoint_scores_are_labelled_columns_with_seed_statistics(tmp_path):
    runs = _runs(tmp_path)
    greedy = {("grpo", 0): 0.61, ("grpo", 1): 0.65, ("rloo", 0): 0.55, ("rloo", 1): 0.53}
    for (algo, seed), run in runs.items():
        make_eval(run, 10, 1, {"accuracy": greedy[algo, seed]})
        make_eval(run, 10, 8, {"accuracy": 0.3, "pass@8": 0.9, "maj@8": greedy[algo, seed] + 0.1},
                  protocols=["maj@8 T=1"])
        make_eval(run, 5, 1, {"accuracy": 0.2})  # an earlier checkpoint: in evals.csv only
    col = collect([tmp_path])
    assert not col.skipped
    g = col.runs[col.runs["algo"] == "grpo"]
    assert list(g["final ckpt greedy@1, 1000 prompts"]) == [0.61, 0.65]
    assert "final ckpt mean@8 T=1, 1000 prompts" not in col.runs  # not among the protocols asked
    assert set(col.runs["eval_protocol"]) == {"greedy@1, 8 prompts"}  # fake runs: task.eval_prompts 8, no run.json record
    assert len(col.evals) == 4 * 3 and col.evals["final"].sum() == 8
    assert set(col.evals.loc[~col.evals["final"], "step"]) == {5}

    rc, out = run_report([str(tmp_path), "--baseline", "grpo", "--no-plots"])
    assert rc == 0
    md = (tmp_path / "report" / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| algo"))
    assert "final acc (greedy@1, 8 prompts)" in header and "best acc (greedy@1, 8 prompts)" in header
    assert "final ckpt greedy@1, 1000 prompts" in header and "final ckpt maj@8 T=1, 1000 prompts" in header
    lo, hi = bootstrap_ci([0.61, 0.65])  # mean ± std [95% bootstrap CI] over seeds, as for final acc
    grpo_row = next(line for line in md.splitlines() if line.startswith("| grpo"))
    assert f"0.630 ± {np.std([0.61, 0.65], ddof=1):.3f} [{lo:.3f}, {hi:.3f}]" in grpo_row
    assert "**0.630" in grpo_row and "**0.730" in grpo_row  # the best row of each score column in bold
    csv = (tmp_path / "report" / "summary.csv").read_text().splitlines()
    assert "eval_protocol" in csv[0] and "final ckpt maj@8 T=1, 1000 prompts mean" in csv[0]
    tex = (tmp_path / "report" / "table.tex").read_text()
    assert "final ckpt maj@8 T=1, 1000 prompts" in tex and "final acc (greedy@1, 8 prompts)" in tex
    evals = (tmp_path / "report" / "evals.csv").read_text()
    assert "maj@8 T=1" in evals and "0.6300,0.6700" in evals  # rloo seed 0's maj@8 0.65 -> its interval over prompts


def test_missing_scores_and_mixed_protocols_are_said_loudly(tmp_path):
    runs = _runs(tmp_path)
    for key in (("grpo", 0), ("grpo", 1), ("rloo", 0)):  # rloo seed 1 not scored yet
        make_eval(runs[key], 10, 1, {"accuracy": 0.6})
    info = json.loads((runs["rloo", 1] / "run.json").read_text())
    (runs["rloo", 1] / "run.json").write_text(json.dumps(info | {"protocol": "greedy@1", "eval_prompts": 64}))
    rc, out = run_report([str(tmp_path), "--no-plots"])
    assert rc == 0
    assert "MIXED PROTOCOLS in the final/best acc columns (greedy@1, 64 prompts; greedy@1, 8 prompts)" in out
    assert "final ckpt greedy@1, 1000 prompts: scored for 3 of 4 runs" in out
    md = (tmp_path / "report" / "report.md").read_text()
    assert "final acc (MIXED protocols)" in md and "WARNING:** MIXED PROTOCOLS" in md
    rloo_row = next(line for line in md.splitlines() if line.startswith("| rloo"))
    assert "0.600 (1 seed) (1/2)" in rloo_row


def test_unfinished_or_corrupt_evaluations_are_skipped_with_the_reason(tmp_path):
    runs = _runs(tmp_path)
    make_eval(runs["grpo", 0], 10, 1, {"accuracy": 0.6}, status="running")
    bad = make_eval(runs["grpo", 1], 10, 1, {"accuracy": 0.6})
    (bad / "metrics.jsonl").write_text("{not json\n")
    col = collect([tmp_path])
    assert len(col.runs) == 4 and col.evals.empty  # the runs themselves are still in the table
    reasons = dict(col.skipped)
    assert any("evaluation not finished" in why for why in reasons.values())
    assert any("unreadable evaluation" in why for why in reasons.values())


def test_eval_folders_are_not_taken_for_runs(tmp_path):
    """An eval directory holds run.json (kind eval): the walk must not list it as a skipped run."""
    run = make_run(tmp_path, "grpo", seed=0)
    make_eval(run, 10, 1, {"accuracy": 0.6})
    col = collect([tmp_path])
    assert col.skipped == [] and len(col.runs) == 1 and len(col.evals) == 1
