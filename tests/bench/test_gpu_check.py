"""bench/gpu_check.py runs its checks on CPU (a dry run: tiny shape, hf rollout) and fails on a broken sync."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRY = ["--cpu", "--shape", "tiny", "--rollout", "hf", "--steps", "2", "--prompts", "4", "--n", "4", "--max-new", "8",
       "runtime.threads=1"]  # fmt: skip


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration
def test_the_dry_run_passes_every_check(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), *DRY, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert {c["check"].split(" ")[0] for c in checks} >= {"steps", "min", "fraction", "max"}
    assert all(c["ok"] for c in checks)


@pytest.mark.integration
def test_a_sync_that_loses_the_weights_fails_the_check(tmp_path, monkeypatch):
    """An engine that ignores the pushed weights (a crash-free, broken sync) fails the sync check."""
    from harness.runtime.rollout.hf import HFRollout

    monkeypatch.setattr(HFRollout, "load_weights", lambda self, state_dict: None)
    failed = _load().main([*DRY, "--out", str(tmp_path)])
    checks = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert failed >= 1
    assert [c["ok"] for c in checks if "sync_checksum" in c["check"]] == [False]
