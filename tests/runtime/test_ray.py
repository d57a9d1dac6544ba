"""``runtime.launcher=ray``: the same Worker class as Ray actors, the same driver loop, end to end on CPU."""

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.commands.cli import main

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'harness[ray]')")

pytestmark = pytest.mark.xdist_group("ray")  # one Ray at a time (pytest -n 2 --dist loadgroup)

from test_workers import EQUIV_RUN, assert_same_trajectory, metrics  # noqa: E402  (same settings as the local equivalence test)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_ray_two_workers_end_to_end_matches_one_local_worker(tmp_path):
    ray_dir, local_dir = tmp_path / "ray", tmp_path / "local"
    cmd = [sys.executable, "-m", "harness.commands.cli", "run", *EQUIV_RUN, "runtime.launcher=ray", "runtime.workers=2",
           f"run_dir={ray_dir}"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    wall = time.perf_counter() - t0
    assert out.returncode == 0, out.stderr[-4000:]
    info = json.loads((ray_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["steps_done"] == 4
    assert info["worker_hosts"] == [platform.node()] * 2  # where each rank ran (run.json)
    assert (ray_dir / "checkpoints" / "step_0000004" / "state.pt").exists()
    ray_rows = metrics(ray_dir)
    assert [r["step"] for r in ray_rows] == [0, 1, 2, 3, 4]
    # The same run with one in-process worker: same samples, same updates up to float rounding.
    main(["run", *EQUIV_RUN, f"run_dir={local_dir}"])
    assert_same_trajectory(ray_rows, metrics(local_dir))
    print(f"ray 2-worker run: {wall:.1f} s wall (Ray start, actors, 4 steps, evals, checkpoint)")
