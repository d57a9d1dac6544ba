"""Smoke run of bench/bench_trl.py: both sides run in lockstep and the report is written.

Integration tier (about a minute: two processes start, import TRL, build a model); skipped
where the bench extra (trl) is not installed, as in CI.
"""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_bench_trl_smoke(tmp_path):
    pytest.importorskip("trl", reason="the bench extra (trl) is not installed")
    report = tmp_path / "performance.md"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_trl.py"), "--steps", "2", "--warmup", "0", "--reps", "1",
           "--sides", "harness,trl", "--threads", "1", "--model", str(tmp_path / "model"), "--sft-steps", "0",
           "--write", str(report)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = report.read_text()
    assert "| harness |" in text and "| trl |" in text and "step / TRL" in text
