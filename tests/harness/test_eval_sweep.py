"""harness eval SWEEP_DIR: protocols, folders, resuming, failures, and the report's columns."""

from __future__ import annotations

import io
import json
import shutil

import pytest
from rich.console import Console

from harness.commands.cli import main
from harness.commands.eval_sweep import evaluate_sweep, parse_protocols
from harness.core.errors import ConfigError
from harness.rundir.schema import eval_dir_name, protocol_kind, protocol_samples, protocol_scores


def test_protocols_group_by_sample_count():
    assert parse_protocols("greedy,maj@8,pass@8") == {1: ("greedy",), 8: ("maj@8", "pass@8")}
    assert parse_protocols("greedy@1, mean@4 ,maj@8,greedy") == {1: ("greedy",), 4: ("mean@4",), 8: ("maj@8",)}
    assert [protocol_samples(p) for p in ("greedy", "greedy@1", "mean@2", "pass@16")] == [1, 1, 2, 16]
    for bad in ("maj@1", "best@4", "maj@", "greedy@2", ""):
        with pytest.raises(ConfigError, match="--protocols"):
            parse_protocols(bad)
    assert protocol_kind("maj@8 T=1") == "maj" and protocol_kind("greedy@1") == "greedy"


def test_scores_and_folders_name_what_decides_the_numbers():
    assert protocol_scores(1, 0.0) == {"greedy@1": "accuracy"}
    assert protocol_scores(8, 0.7) == {"mean@8 T=0.7": "accuracy", "pass@8 T=0.7": "pass@8", "maj@8 T=0.7": "maj@8"}
    # sorted overrides, '/' kept out of the folder name, the temperature once; greedy is T=0 whatever is asked
    assert eval_dir_name(8, 1.0, ["task.source=../data/x", "eval_limit=1000", "rollout.temperature=1.0"]) \
        == "samples=8,T=1,eval_limit=1000,task.source=.._data_x"
    assert eval_dir_name(1, 1.0, []) == "samples=1,T=0"


def test_sweep_options_need_a_sweep_directory(tmp_path):
    with pytest.raises(SystemExit, match="applies to a sweep directory"):
        main(["eval", "--protocols", "greedy,maj@8"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="needs a value"):
        main(["eval", str(tmp_path / "empty"), "--protocols"])


@pytest.mark.integration
def test_a_sweep_is_scored_resumably_and_the_report_shows_it(tmp_path, fast_run):
    from analysis import report

    sweep = tmp_path / "sweep"
    for algo in ("grpo", "rloo"):
        run = sweep / f"algo={algo},seed=0"
        run.mkdir(parents=True)  # an existing path needs no Hydra quoting (harness.commands.cli.quote_paths)
        main(["run", *fast_run, f"algo={algo}", "trainer.checkpoint_every=0", "task.eval_prompts=24", f"run_dir={run}"])
    broken = sweep / "broken" / "algo=grpo,seed=1"  # a copy whose checkpoint is corrupt
    shutil.copytree(sweep / "algo=grpo,seed=0", broken, ignore=shutil.ignore_patterns("evals"))
    (next(broken.glob("checkpoints/step_*/policy")) / "model.safetensors").write_bytes(b"not a safetensors file")

    out = io.StringIO()
    status = evaluate_sweep(sweep, "greedy,maj@4", "final", [], Console(file=out, width=250))
    assert status == 1  # the broken copy failed, and it did not stop the others
    text = out.getvalue()
    assert "6 evaluation(s) of 3 run(s), 0 already finished" in text and "4/6 evaluation(s) finished" in text
    assert "failed" in text and "broken" in text

    for algo in ("grpo", "rloo"):
        run = sweep / f"algo={algo},seed=0"
        final = sorted(run.glob("checkpoints/step_*"))[-1].name
        greedy = run / "evals" / final / "samples=1,T=0"
        info = json.loads((greedy / "run.json").read_text())
        assert info["status"] == "finished" and info["protocols"] == ["greedy@1"] and info["eval_prompts"] == 24
        # the run's own task (24 held-out prompts, inherited): greedy equals the run's logged final eval exactly
        logged = json.loads((run / "run.json").read_text())
        assert logged["protocol"] == "greedy@1" and logged["eval_prompts"] == 24
        assert info["eval_final"] == logged["eval_final"]
        sampled = json.loads((run / "evals" / final / "samples=4,T=1" / "run.json").read_text())
        assert sampled["samples"] == 4 and sampled["protocols"] == ["maj@4 T=1"]

    shutil.rmtree(sweep / "broken")
    out = io.StringIO()
    assert evaluate_sweep(sweep, "greedy,maj@4", "final", [], Console(file=out, width=250)) == 0
    assert "4 already finished (skipped), 0 to run" in out.getvalue()  # resumed: nothing is scored twice

    buf = io.StringIO()
    assert report.main([str(sweep), "--no-plots", "--format", "md,csv"], console=Console(file=buf, width=400)) == 0
    md = (sweep / "report" / "report.md").read_text()
    assert "final acc (greedy@1, 24 prompts)" in md
    assert "final ckpt greedy@1, 24 prompts" in md and "final ckpt maj@4 T=1, 24 prompts" in md
    assert "final ckpt mean@4" not in md  # not asked for
    csv = (sweep / "report" / "summary.csv").read_text()
    assert "final ckpt maj@4 T=1, 24 prompts mean" in csv.splitlines()[0]
    evals = (sweep / "report" / "evals.csv").read_text().splitlines()
    assert len(evals) == 1 + 4 and evals[0].split(",")[-4:] == ["value", "ci_low", "ci_high", "eval_dir"]
