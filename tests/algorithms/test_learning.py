"""Every built-in algorithm learns `arith` (integration tier, fixed seed).

Each run starts from the same cached warm start (greedy held-out accuracy ~0.12 on the
128 eval prompts) and must end at least ``MIN_GAIN`` above it. The eval set's binomial
standard error at p ~ 0.15 is ~0.03, so a gain of 0.06 is two standard errors: a run
whose policy does not improve (or collapses, as PPO with one sample per prompt did at
lr 3e-4) fails. Runs are deterministic for a fixed seed and thread count.
"""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.docs_gen import builtin_algorithms

pytestmark = pytest.mark.integration

MIN_GAIN = 0.06
STEPS = 100
COMMON = [
    f"trainer.steps={STEPS}", "trainer.eval_every=50", "trainer.checkpoint_every=0", "seed=0",
    "runtime.threads=2",
]


@pytest.mark.parametrize("name", sorted(builtin_algorithms()))
def test_algorithm_learns_arith(name, tmp_path):
    run_dir = tmp_path / name
    main(["run", f"algo={name}", *COMMON, f"run_dir={run_dir}"])
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["steps_done"] == STEPS
    gain = info["eval_final"] - info["eval_first"]
    assert gain >= MIN_GAIN, f"{name}: eval accuracy {info['eval_first']:.3f} -> {info['eval_final']:.3f}"
