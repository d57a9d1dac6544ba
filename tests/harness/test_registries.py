"""The task and rollout-backend registries (a user's own from their package), did-you-mean in every registry,
and the layer contracts' coverage."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import algorithms
import rewards
from harness.commands.cli import main
from harness.config import ConfigError, compose_config, validate
from harness.data.tasks import DataError, available_tasks, get_task, load_task, registered_tasks

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

    from harness.commands.cli import _SacctOnce

    sacct = _SacctOnce()
    records = [logging.LogRecord("submitit", logging.WARNING, "", 0, f"Call #{i} - Bypassing sacct error x", (), None)
               for i in range(5)]
    shown = [r for r in records if sacct.filter(r)]
    assert len(shown) == 1 and "Later sacct failures are counted" in shown[0].getMessage() and sacct.count == 5
    other = logging.LogRecord("submitit", logging.WARNING, "", 0, "something else", (), None)
    assert sacct.filter(other)


def _run_metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("perf/", "budget/wall_s"))} for r in rows]


@pytest.mark.integration
@pytest.mark.parametrize("workers", [1, 2])
def test_a_plugin_rollout_backend_runs_end_to_end(tmp_path, fast_run, monkeypatch, workers):
    """A backend registered from a user package (a recorder around hf) is built on every worker, serves
    every generation and weight sync, and gives the very numbers of the hf backend it wraps."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))  # spawned workers
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("HARNESS_TEST_ROLLOUT_LOG", str(log))
    common = [*fast_run, "trainer.steps=2", f"runtime.workers={workers}", "runtime.threads=1"]
    main(["run", *common, f"run_dir={tmp_path / 'hf'}"])
    main(["run", *common, "plugins=[harness_test_plugin.my_backend]", "rollout.backend=recording",
          f"run_dir={tmp_path / 'plugin'}"])
    assert _run_metrics(tmp_path / "plugin") == _run_metrics(tmp_path / "hf")
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    pids = {c["pid"] for c in calls}
    assert len(pids) == workers and (workers > 1) == (os.getpid() not in pids)
    per_worker = {m: sum(c["method"] == m for c in calls) / workers for m in ("generate", "load_weights")}
    # 2 steps: a rollout each, evals at steps 0 and 2; a weight sync after each update
    assert per_worker == {"generate": 4, "load_weights": 2}
    with pytest.raises(ConfigError, match="rollout.backend='recordin' is unknown .did you mean 'recording'"):
        validate(compose_config(["rollout.backend=recordin"]))


def test_every_harness_module_is_in_a_layers_contract():
    """lint-imports only checks the modules its layers name: a new module left out would be unchecked."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    for package, contract in (("harness", "harness layers"), ("harness.runtime", "runtime layers")):
        layers = next(c["layers"] for c in contracts if c["name"].startswith(contract))
        named = {m.strip() for layer in layers for m in layer.split("|")}
        folder = root / package.replace(".", "/")
        modules = {f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
        modules |= {f"{package}.{p.name}" for p in folder.iterdir() if (p / "__init__.py").is_file()}
        assert modules - named == set(), f"{contract}: add these modules to a layer in pyproject.toml"


def test_backend_registry_refuses_a_second_owner_and_plans_a_backend_without_memory(monkeypatch):
    """A name already taken by another module is refused (a plugin cannot silently replace hf); a backend that
    states no memory term is planned with nothing for it; remote chosen by name needs its URL."""
    import harness.runtime.rollout.base as base
    from harness.plan import plan
    from harness.runtime.rollout import get_backend, register_backend

    monkeypatch.setattr(base.REGISTRY, "_entries", dict(base.REGISTRY.entries()))

    def build(ctx):  # another module's builder named like hf's
        raise AssertionError("never built")

    with pytest.raises(ValueError, match="'hf' is already registered by harness.runtime.rollout.hf"):
        register_backend("hf", summary="an impostor")(build)
    register_backend("bare", summary="no memory term")(build)
    assert get_backend("bare").memory is None
    cfg = compose_config(["rollout.backend=bare"])
    result = plan(cfg, list(algorithms.build(cfg.algo).needs.roles))
    assert "engine_bytes" not in result and not any("rollout engine" in k for k in result["worker_bytes"])
    with pytest.raises(ConfigError, match="rollout.backend=remote needs rollout.server.url"):
        validate(compose_config(["rollout.backend=remote"]))
