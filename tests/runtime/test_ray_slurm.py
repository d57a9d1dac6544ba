"""scripts/ray_slurm.sbatch on a one-node SLURM: Ray head up, a harness run attached to it, Ray down.

This checks the template's mechanics on the one-node cluster CI starts (allocation parsing,
`ray start` as job steps, waiting for the nodes, `runtime.ray_address` appended, clean stop);
tests/runtime/test_multihost.py runs it over 2 nodes.
Needs SLURM (e.g. `scripts/local_slurm.sh start`) and the ray extra; skipped otherwise,
a failure when HARNESS_TEST_SLURM=1.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("ray")]  # one Ray at a time (pytest -n 2)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "sweeps"))
from test_slurm import _require_slurm, _slurm_env  # noqa: E402  (the sweeps test's SLURM gate)


def ray_processes(job_id: str) -> str:
    """pids of the processes of scripts/ray_slurm.sbatch's Ray for this job (its temp dir /tmp/ray-JOBID;
    not /tmp/ray-JOBID0...: another job's)."""
    return subprocess.run(["pgrep", "-f", f"/tmp/ray-{job_id}([^0-9]|$)"], capture_output=True, text=True).stdout.strip()


def test_sbatch_template_runs_harness_on_a_ray_cluster(tmp_path, fast_run):
    pytest.importorskip("ray")
    env = _slurm_env()
    _require_slurm(env)
    bindir = str(Path(sys.executable).parent)  # `ray` and `harness` of this environment
    env |= {"PATH": f"{bindir}:{env['PATH']}", "PYTHONPATH": str(ROOT), "RAY_WAIT_S": "120"}
    run_dir = tmp_path / "run"
    out = subprocess.run(
        ["sbatch", "--parsable", "--wait", "--nodes=1", "--cpus-per-task=2", "--time=15",
         f"--output={tmp_path}/job.out", str(ROOT / "scripts" / "ray_slurm.sbatch"),
         "harness", "run", *fast_run, "runtime.workers=2", "runtime.threads=1", f"run_dir={run_dir}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert out.returncode == 0, out.stderr[-2000:] + log[-4000:]
    assert "[ray_slurm] cluster up: 1 node(s)" in log
    assert "runtime.ray_address=" in log
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["steps_done"] == 3
    config = (run_dir / "config.yaml").read_text()
    assert "launcher: ray" in config and "ray_address: " in config
    time.sleep(2)
    assert ray_processes(out.stdout.strip()) == "", "Ray processes of the job outlived it"
