"""Plugins (plugins=[module] and the harness.algorithms entry points) and the generated docs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands.cli import main
from harness.commands.docs_gen import algorithms_table
from harness.runtime.train.checkpoint_files import read_engine_state

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "plugin_fixtures"


@pytest.mark.integration
def test_plugin_module_runs_end_to_end(tmp_path, fast_run, monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    run_dir = tmp_path / "run"
    main(["run", *fast_run, "trainer.steps=2", "plugins=[harness_test_plugin.my_algo]", "algo=test_plugin_algo",
          f"run_dir={run_dir}"])
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["algo"] == "test_plugin_algo"


@pytest.mark.integration
def test_plugin_declares_its_own_models(tmp_path, fast_run, monkeypatch):
    """A plugin's own roles (names the runtime has never seen) are built, run, trained and
    checkpointed, and a resumed run restores the trained one."""

    monkeypatch.syspath_prepend(str(FIXTURES))
    run_dir = tmp_path / "run"
    args = ["run", *fast_run, "plugins=[harness_test_plugin.my_algo]", "algo=test_plugin_roles",
            "trainer.checkpoint_every=1", f"run_dir={run_dir}"]
    main([*args, "trainer.steps=2"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step2 = rows[2]
    assert step2["value_net/grad_norm"] > 0 and "plugin/value_loss" in step2 and "plugin/extra_score" in step2
    assert "anchor/grad_norm" not in step2 and step2["plugin/anchor_logp_mean"] < 0  # frozen, run: log-probs
    # the extra responses count in the budget: 4 prompts x (4 samples + 1 extra)
    assert step2["budget/generated_tokens"] > rows[1]["budget/generated_tokens"] + step2["rollout/generated_tokens"]
    # the value net learned: its prediction moved off its zero-initialised head
    assert rows[1]["plugin/predicted_mean"] == 0.0 and step2["plugin/predicted_mean"] != 0.0
    ckpt = sorted((run_dir / "checkpoints").iterdir())[-1]
    assert set(read_engine_state(ckpt)) == {"policy", "value_net"}  # trainable models only
    main([*args, "trainer.steps=3"])  # resumes from step 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[3]["plugin/predicted_mean"] != 0.0


def _env_with_path(*paths) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_entry_point_group_registers_algorithm(tmp_path):
    # A minimal installed distribution: importlib.metadata finds *.dist-info dirs on sys.path.
    dist = tmp_path / "harness_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: harness-test-plugin\nVersion: 0.1\n")
    # One plug-in of each kind whose registry reads entry points (harness/core/registry.py): all of them use
    # the same Registry, so each group is found the same way.
    (dist / "entry_points.txt").write_text("[harness.algorithms]\ntest_plugin_algo = harness_test_plugin.my_algo\n"
                                           "[harness.tasks]\necho = harness_test_plugin.my_task\n"
                                           "[harness.backends]\nrecording = harness_test_plugin.my_backend\n")
    code = "from harness.commands.cli import main; main(['list'])"
    cwd = tmp_path / "cwd"  # `python -c` puts the working directory on sys.path: keep it empty
    cwd.mkdir()
    # A fresh interpreter: load_plugins() caches that entry points were read.
    out = subprocess.run([sys.executable, "-c", code], env=_env_with_path(tmp_path, FIXTURES), cwd=cwd,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "test_plugin_algo" in out.stdout and "batch-mean baseline" in out.stdout
    assert "repeat a number (test plugin)" in out.stdout and "every call written" in out.stdout
    # Without the dist-info the plugin is not found (the module alone is not imported).
    out = subprocess.run([sys.executable, "-c", code], env=_env_with_path(FIXTURES), cwd=cwd,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "test_plugin_algo" not in out.stdout and "repeat a number" not in out.stdout


def test_docs_algorithms_md_is_generated():
    committed = (ROOT / "docs" / "algorithms.md").read_text()
    assert committed == algorithms_table(), "regenerate: python -m harness.commands.docs_gen > docs/algorithms.md"


def test_docs_table_lists_builtins_only_with_full_metadata():
    table = algorithms_table()
    for name in ("grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo", "cispo"):
        assert f"| `{name}` |" in table
    assert "test_plugin_algo" not in table  # plugins never leak into the built-in docs
    assert "| ? |" not in table and " ? |" not in table  # every column filled from metadata
