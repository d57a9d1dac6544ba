"""A 2-job sweep through SLURM (hydra/launcher=submitit_slurm) ends in 2 finished runs and a report.

Needs a working SLURM (e.g. `scripts/local_slurm.sh start`, which writes
/tmp/harness-slurm/env.sh with SLURM_CONF) and hydra-submitit-launcher. Skipped unless
`sinfo` answers; HARNESS_TEST_SLURM=1 makes a missing cluster a failure instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

# One SLURM test at a time (the preemption test signals a queued job: it must find only its own).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("slurm")]

LOCAL_CONF = Path(os.environ.get("HARNESS_SLURM_DIR", "/tmp/harness-slurm")) / "etc" / "slurm.conf"


def _slurm_env() -> dict[str, str]:
    env = dict(os.environ)
    if "SLURM_CONF" not in env and LOCAL_CONF.exists():
        env["SLURM_CONF"] = str(LOCAL_CONF)  # the cluster of scripts/local_slurm.sh
    return env


def _require_slurm(env: dict[str, str]) -> None:
    forced = os.environ.get("HARNESS_TEST_SLURM") == "1"
    why = None
    if shutil.which("sinfo") is None:
        why = "sinfo not found"
    else:
        try:
            r = subprocess.run(["sinfo", "-h", "-o", "%P %T"], env=env, capture_output=True, text=True, timeout=15)
            if r.returncode or not r.stdout.strip():
                why = f"sinfo failed: {r.stderr.strip()[:200]}"
        except subprocess.TimeoutExpired:
            why = "sinfo did not answer within 15 s"
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
    except ImportError:
        why = why or "hydra-submitit-launcher not installed (pip install -e '.[slurm]')"
    if why:
        if forced:
            pytest.fail(f"HARNESS_TEST_SLURM=1 but {why}")
        pytest.skip(why)


def test_submitit_slurm_sweep_runs_and_reports(tmp_path, fast_run):
    env = _slurm_env()
    _require_slurm(env)
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable, "-c", "from harness.commands.cli import main; main()", "sweep",
        "hydra/launcher=submitit_slurm",
        f"hydra.launcher.partition={os.environ.get('HARNESS_TEST_SLURM_PARTITION', 'debug')}",
        "hydra.launcher.timeout_min=15",
        "hydra.launcher.cpus_per_task=1",
        f"hydra.sweep.dir={sweep}",
        "algo=grpo", "seed=0,1", "runtime.threads=1", *fast_run,
    ]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = sorted(p.parent for p in sweep.glob("*/run.json"))
    assert len(runs) == 2, list(sweep.iterdir())
    for d in runs:
        info = json.loads((d / "run.json").read_text())
        assert info["status"] == "finished" and info["algo"] == "grpo"
    assert {json.loads((d / "run.json").read_text())["seed"] for d in runs} == {0, 1}

    from analysis import report

    assert report.main([str(sweep), "--no-plots", "--format", "csv"]) == 0
    import pandas as pd

    table = pd.read_csv(sweep / "report" / "summary.csv", comment="#")
    assert len(table) == 1 and table.loc[0, "algo"] == "grpo" and table.loc[0, "n_seeds"] == 2


def _steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def test_preempted_slurm_job_requeues_and_resumes(tmp_path, fast_run):
    """USR2 is what SLURM sends before a timeout or a preemption; submitit then requeues the
    job (``harness sweep`` sets hydra.launcher.max_num_timeout) and the run resumes from its
    checkpoint: every step appears once and the run finishes."""
    env = _slurm_env()
    _require_slurm(env)
    sweep = tmp_path / "sweep"
    steps = 60
    args = [a for a in fast_run if not a.startswith("trainer.steps")]
    cmd = [
        sys.executable, "-c", "from harness.commands.cli import main; main()", "sweep",
        "hydra/launcher=submitit_slurm",
        f"hydra.launcher.partition={os.environ.get('HARNESS_TEST_SLURM_PARTITION', 'debug')}",
        "hydra.launcher.timeout_min=15", "hydra.launcher.cpus_per_task=1", f"hydra.sweep.dir={sweep}",
        "algo=grpo", "seed=0", "runtime.threads=1", *args, f"trainer.steps={steps}", "trainer.checkpoint_every=1",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 600
        run_dir = None
        while time.time() < deadline:  # wait until the job has trained (and checkpointed) a few steps
            runs = [p.parent for p in sweep.glob("*/metrics.jsonl")]
            if runs and len(_steps(runs[0])) >= 4:
                run_dir = runs[0]
                break
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        assert run_dir is not None, "the SLURM job never started training"
        jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True).stdout.split()
        ours = {d.name.split("_")[0] for d in (sweep / ".submitit").iterdir() if d.is_dir()}
        jobs = [j for j in jobs if j.split("_")[0] in ours]  # this sweep's job, never another test's
        assert jobs, "no SLURM job of this sweep in the queue"
        subprocess.run(["scancel", "--signal=USR2", jobs[0]], env=env, check=True)
        stopped_at = _steps(run_dir)[-1]
        # SLURM holds a requeued job ~2 min before it is eligible again; release it now.
        while proc.poll() is None and time.time() < deadline:
            state = subprocess.run(["squeue", "-h", "-j", jobs[0], "-o", "%T"], env=env, capture_output=True,
                                   text=True).stdout.strip()
            if state == "PENDING":
                subprocess.run(["scontrol", "update", f"JobId={jobs[0]}", "StartTime=now"], env=env)
            time.sleep(1)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["steps_done"] == steps
    assert stopped_at < steps, "the job finished before it was signalled; raise trainer.steps"
    assert _steps(run_dir) == list(range(steps + 1))  # resumed, nothing lost or repeated
    logs = "".join(p.read_text(errors="replace") for p in sweep.rglob("*_log.err"))
    assert "requeu" in logs.lower() or "checkpoint" in logs.lower(), logs[-2000:]
