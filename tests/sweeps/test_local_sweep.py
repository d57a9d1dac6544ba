"""Local sweeps: a parallel multirun (hydra/launcher=joblib) finishes every run; relaunching
the same sweep trains nothing (finished runs are skipped before any model is loaded)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def _sweep(tmp_path, sweep, fast_run):
    cmd = [
        sys.executable, "-c", "from harness.commands.cli import main; main()", "sweep",
        "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
        "algo=grpo,rloo", "seed=0", "runtime.threads=1", *fast_run,
    ]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout + r.stderr


def test_parallel_sweep_then_relaunch_skips_finished_runs(tmp_path, fast_run):
    sweep = tmp_path / "sweep"
    _sweep(tmp_path, sweep, fast_run)
    runs = sorted(p.parent for p in sweep.glob("*/run.json"))
    assert len(runs) == 2, list(sweep.iterdir())
    infos = [json.loads((d / "run.json").read_text()) for d in runs]
    assert {i["algo"] for i in infos} == {"grpo", "rloo"} and all(i["status"] == "finished" for i in infos)
    before = {d: (d / "metrics.jsonl").read_text() for d in runs}

    out = _sweep(tmp_path, sweep, fast_run)
    assert out.count("already finished") == 2, out[-3000:]
    assert {d: (d / "metrics.jsonl").read_text() for d in runs} == before  # nothing retrained or lost
