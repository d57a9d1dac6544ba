"""Regression pin: 6 steps of every built-in algorithm (fixed seed) give exactly the recorded metrics.

A refactor of shared code (ops, the engine, the loop) must not move any number. The hashes in
``pinned_metrics.json`` cover every metric except timings, for each algorithm; they are exact
only for the float kernels they were recorded on (CPU SIMD flags and torch version), so on
another machine the test skips and says so. Record anew (only when a change is meant to move
results, and say so in the commit):

    HARNESS_PIN_UPDATE=1 python -m pytest tests/algorithms/test_pinned_metrics.py
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.docs_gen import builtin_algorithms
from harness.models import cpu_flags

pytestmark = pytest.mark.integration
PINS = Path(__file__).with_name("pinned_metrics.json")
UPDATE = os.environ.get("HARNESS_PIN_UPDATE") == "1"
VOLATILE = ("perf/", "budget/wall_s")  # timings differ run to run


def _machine() -> dict:
    return {"cpu_flags": cpu_flags(), "torch": torch.__version__.split("+")[0]}


def metrics_hash(run_dir: Path) -> tuple[str, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kept = [{k: v for k, v in sorted(r.items()) if not k.startswith(VOLATILE)} for r in rows]
    blob = json.dumps(kept, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest(), kept[-1]


@pytest.mark.parametrize("name", sorted(builtin_algorithms()))
def test_six_steps_are_pinned(name, tmp_path):
    pins = json.loads(PINS.read_text()) if PINS.exists() else {"machine": _machine(), "hashes": {}}
    if not UPDATE and pins["machine"] != _machine():
        pytest.skip(f"pins recorded on {pins['machine']}; this machine is {_machine()} (other float kernels)")
    run_dir = tmp_path / name
    # The shipped warm start (accuracy ~0.1, so rewards vary and every algorithm's update is
    # its own; a model that is always wrong would give all of them zero advantages).
    main(["run", f"algo={name}", "trainer.steps=6", "trainer.prompts_per_step=8", "trainer.eval_every=3",
          "trainer.micro_batch_sequences=32", "seed=3", "runtime.threads=1", "teacher.sft_steps=20", f"run_dir={run_dir}"])
    digest, last = metrics_hash(run_dir)
    assert any(abs(r) > 0 for k, r in last.items() if k.startswith("loss/policy")), "no policy gradient: a vacuous pin"
    if UPDATE:
        pins["machine"] = _machine()
        pins["hashes"][name] = digest
        PINS.write_text(json.dumps(pins, indent=2, sort_keys=True) + "\n")
        return
    if name not in pins["hashes"]:  # added after the pin machine's last recording (pins need that machine's kernels)
        pytest.skip(f"no pin for {name} recorded on {pins['machine']}: record there with HARNESS_PIN_UPDATE=1")
    assert digest == pins["hashes"][name], f"{name}: 6-step metrics moved; last line now {last}"
