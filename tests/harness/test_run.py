"""End-to-end runs: files on disk, resume, determinism (SIGKILL mid-run, then resume)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.commands.cli import main


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def comparable(rows: list[dict]) -> list[dict]:
    """Everything but wall-clock measurements."""
    return [{k: v for k, v in r.items() if not k.startswith("perf/") and k != "budget/wall_s"} for r in rows]


def test_smoke_run_writes_results(tmp_path, fast_run):
    run_dir = tmp_path / "run"
    main(["run", *fast_run, f"run_dir={run_dir}"])
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["steps_done"] == 3
    assert info["checker"] == "arith@1" and info["algo"] == "grpo" and info["seed"] == 0
    assert info["versions"]["torch"] and "sha" in info["git"]
    assert info["generated_tokens"] > 0 and info["eval_final"] is not None
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "eval/arith/accuracy" in rows[0] and "eval/arith/accuracy" in rows[2] and "eval/arith/accuracy" in rows[3]
    for key in ("reward/mean", "reward/accuracy", "rollout/response_tokens_mean", "rollout/truncated_frac",
                "rollout/zero_std_group_frac", "loss/policy", "loss/kl", "policy/clipfrac", "policy/entropy",
                "perf/step_s", "perf/rollout_tokens_per_s"):
        assert key in rows[1], key
    assert OmegaConf.load(run_dir / "config.yaml").algo.name == "grpo"
    assert (run_dir / "checkpoints" / "step_0000003" / "state.pt").exists()


def test_rerun_with_other_config_is_refused(tmp_path, fast_run):
    run_dir = tmp_path / "run"
    main(["run", *fast_run, f"run_dir={run_dir}"])
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(SystemExit, match="different config.*trainer.lr"):
        main(["run", *fast_run, f"run_dir={run_dir}", "trainer.lr=0.5"])
    assert (run_dir / "metrics.jsonl").read_text() == before  # nothing already written is lost


def test_finished_run_extends_with_more_steps(tmp_path, fast_run):
    run_dir = tmp_path / "run"
    main(["run", *fast_run, f"run_dir={run_dir}"])
    main(["run", *fast_run, f"run_dir={run_dir}", "trainer.steps=4"])
    assert [r["step"] for r in metrics(run_dir)] == [0, 1, 2, 3, 4]


def test_finished_run_is_skipped_without_loading_models(tmp_path, fast_run, monkeypatch):
    run_dir = tmp_path / "run"
    main(["run", *fast_run, f"run_dir={run_dir}"])
    before = (run_dir / "metrics.jsonl").read_text()

    def no_model(*_a, **_k):
        raise AssertionError("a finished run must not load its model again")

    monkeypatch.setattr("harness.trainer.resolve_model", no_model)
    main(["run", *fast_run, f"run_dir={run_dir}"])  # a relaunched sweep: returns at once
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_token_budget_ends_the_run(tmp_path, fast_run):
    run_dir = tmp_path / "run"
    args = [a for a in fast_run if not a.startswith("trainer.steps")]
    main(["run", *args, f"run_dir={run_dir}", "trainer.steps=50", "trainer.budget=tokens", "trainer.budget_tokens=1"])
    info = json.loads((run_dir / "run.json").read_text())
    rows = metrics(run_dir)
    # Any generation exceeds 1 token: the run stops after step 1, evaluated and checkpointed.
    assert [r["step"] for r in rows] == [0, 1] and "eval/arith/accuracy" in rows[-1]
    assert info["steps_done"] == 1 and info["budget"] == "tokens=1" and info["generated_tokens"] >= 1
    assert (run_dir / "checkpoints" / "step_0000001" / "state.pt").exists()
    # A larger token budget continues the same run from its checkpoint.
    budget = rows[-1]["budget/generated_tokens"] + 1
    main(["run", *args, f"run_dir={run_dir}", "trainer.steps=50", "trainer.budget=tokens",
          f"trainer.budget_tokens={budget}"])
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[-1]["budget/generated_tokens"] >= budget


def test_wall_budget_ends_the_run(tmp_path, fast_run):
    run_dir = tmp_path / "run"
    args = [a for a in fast_run if not a.startswith("trainer.steps")]
    main(["run", *args, f"run_dir={run_dir}", "trainer.steps=50", "trainer.budget=wall_s", "trainer.budget_wall_s=1e-6"])
    info = json.loads((run_dir / "run.json").read_text())
    assert info["steps_done"] == 1 and info["budget"] == "wall_s=1e-06"


@pytest.mark.integration
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path, fast_run):
    args = [a for a in fast_run if not a.startswith("trainer.steps")]
    args += ["trainer.steps=8", "trainer.checkpoint_every=2", "seed=3"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "harness.commands.cli", "run", *args]

    straight = tmp_path / "straight"
    subprocess.run([*cmd, f"run_dir={straight}"], check=True, env=env, capture_output=True, timeout=600)

    killed = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, f"run_dir={killed}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "step_0000004" / "state.pt").exists():
        assert proc.poll() is None, "run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads((killed / "run.json").read_text())["status"] == "running"
    subprocess.run([*cmd, f"run_dir={killed}"], check=True, env=env, capture_output=True, timeout=600)

    a, b = comparable(metrics(straight)), comparable(metrics(killed))
    assert [r["step"] for r in b] == list(range(9))
    assert a == b


@pytest.mark.integration
def test_same_seed_same_metrics_other_seed_differs(tmp_path, fast_run):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        main(["run", *fast_run, f"seed={seed}", f"run_dir={tmp_path / name}"])
    a, b, c = (comparable(metrics(tmp_path / n)) for n in "abc")
    assert a == b
    assert a != c


def test_run_dir_from_another_schema_version_is_accepted_but_changed_values_are_not(tmp_path, compose_cfg, caplog):
    """A field added or renamed between versions is a schema change, said in a warning; a field
    present on both sides with another value is another run, refused."""
    import yaml
    from omegaconf import OmegaConf

    from harness.config import ConfigError
    from harness.rundir.writer import RunDir

    cfg = compose_cfg(["algo=prime"])
    RunDir(tmp_path, cfg)
    old = yaml.safe_load((tmp_path / "config.yaml").read_text())
    old["algo"]["max_sampling_rounds"] = 3  # the field's old name
    del old["algo"]["extra_sampling_rounds"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    with caplog.at_level("WARNING"):
        RunDir(tmp_path, cfg)  # accepted
    assert "another version of the config schema" in caplog.text and "max_sampling_rounds" in caplog.text
    with pytest.raises(ConfigError, match="algo.prm_lr_scale"):
        RunDir(tmp_path, OmegaConf.merge(cfg, {"algo": {"prm_lr_scale": 0.5}}))
