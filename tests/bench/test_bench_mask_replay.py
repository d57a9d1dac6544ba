"""bench/bench_mask_replay.py (docs/mismatch.md, what mask replay costs) runs, at a small vocabulary, and prints
both kept sizes against the log-prob it feeds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_mask_replay_bench_prints_its_ratios():
    cmd = [sys.executable, str(ROOT / "bench" / "bench_mask_replay.py"), "--vocab", "2000", "--tokens", "16",
           "--repeats", "1", "--threads", "1"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("log-prob (chunked log-softmax), 16 tokens x vocab 2000:")
    assert [line.split(":")[0] for line in lines[1:]] == ["replay_kept_set, kept 20", "replay_kept_set, kept 1000"]
    assert all("x the log-prob" in line for line in lines[1:])
