"""The task registry (a user's task from their own package) and did-you-mean in every registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import algorithms
import rewards
from harness.cli import main
from harness.config import ConfigError, validate
from harness.tasks import DataError, available_tasks, get_task, load_task, registered_tasks

FIXTURES = Path(__file__).resolve().parents[1] / "plugin_fixtures"


def test_builtin_tasks_are_registered_with_their_presets():
    tasks = registered_tasks()
    assert {"arith", "gsm8k", "math", "math500"} <= set(tasks)
    assert tasks["gsm8k"].preset["checker"] == "gsm8k" and "####" in tasks["gsm8k"].preset["prompt_template"]
    assert tasks["math"].answer_format("7") == "The answer is \\boxed{7}"
    assert tasks["arith"].answer_format("7") == "7" and tasks["arith"].row_parser is None
    assert "MATH-500" in available_tasks()["math500"]


def test_unknown_names_suggest_the_nearest(compose_cfg):
    with pytest.raises(DataError, match="did you mean 'gsm8k'"):
        get_task("gsm8kk")
    with pytest.raises(KeyError, match="did you mean 'grpo'"):
        algorithms.get_class("grpoo")
    with pytest.raises(KeyError, match="did you mean 'math'"):
        rewards.get("maths")
    with pytest.raises(ConfigError, match="did you mean 'arith'"):
        validate(compose_cfg(["task.checker=arth"]))
    with pytest.raises(SystemExit, match="did you mean 'rloo'"):
        main(["run", "algo=rlo"])


@pytest.mark.integration
def test_a_plugin_task_runs_without_editing_the_harness(tmp_path, fast_run, monkeypatch, compose_cfg):
    monkeypatch.syspath_prepend(str(FIXTURES))
    run_dir = tmp_path / "run"
    main(["run", *fast_run, "trainer.steps=2", "plugins=[harness_test_plugin.my_task]", "task=echo",
          f"run_dir={run_dir}"])
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["task"] == "echo" and info["checker"].startswith("arith@")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "eval/echo/accuracy" in metrics[0]
    task = load_task(compose_cfg(["task=echo", "task.eval_prompts=5"]).task)
    assert [ex.ground_truth for ex in task.test] == ["10", "11", "12", "13", "14"]


def test_repeated_sacct_warnings_are_shown_once_and_counted():
    import logging

    from harness.cli import _SacctOnce

    sacct = _SacctOnce()
    records = [logging.LogRecord("submitit", logging.WARNING, "", 0, f"Call #{i} - Bypassing sacct error x", (), None)
               for i in range(5)]
    shown = [r for r in records if sacct.filter(r)]
    assert len(shown) == 1 and "Later sacct failures are counted" in shown[0].getMessage() and sacct.count == 5
    other = logging.LogRecord("submitit", logging.WARNING, "", 0, "something else", (), None)
    assert sacct.filter(other)
