"""The positive controls' regimes act (sweeps/controls.yaml, docs/controls.md): one RL step of each arm as the
preset runs it, from the shipped reasoning start, shows the mechanism's diagnostic over its floor. The full
controls (5 seeds x 12 arms, ~60 min) are a preset, not a test; these check that the regime still makes the
mechanism act after any change to the code or the start.

The critic warm-up's mechanism is tested in tests/algorithms/test_ppo_remax.py (the policy frozen, the critic
learning); the length bias's, GRPO's 1/|o| against Dr. GRPO's constant, by hand values in tests/algorithms/test_ops.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from harness.commands.cli import main

pytestmark = pytest.mark.integration

PRESET = yaml.safe_load((Path(__file__).resolve().parents[2] / "sweeps" / "controls.yaml").read_text())
FIXED = [o for o in PRESET["overrides"] if not o.startswith(("hydra", "trainer.budget", "trainer.steps", "trainer.eval"))]


def _arm(*want: str) -> list[str]:
    """The preset's control arm holding every override in ``want``."""
    return next(arm for arm in PRESET["controls"] if all(w in arm for w in want))


def _floor(control: str) -> float:
    return next(v["acts"]["min"] for v in PRESET["verdicts"] if v["control"].startswith(control))


def _first_step(tmp_path, overrides: list[str]) -> dict:
    run_dir = tmp_path / "run"
    main(["run", *FIXED, *overrides, "trainer.steps=1", "trainer.eval_every=1000", f"run_dir={run_dir}"])
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1]


# The clip-higher regime's step-1 clipped fraction, seeds 0-4 of the preset (2026-12-07, AMD EPYC Zen 3, 1 thread):
# 0.108, 0.084, 0.079, 0.075, 0.077 (mean 0.085, under the preset's floor of 0.10: its verdict is "not testable");
# at the testbed's lr 1e-4 and temperature 1: 0.029. The test holds the regime to what it measured (seed 0).
CLIP_BINDS = 0.06


def test_the_clip_binds_in_the_clip_higher_regime(tmp_path):
    """(0.8, 1.2) at 4 passes of 16 minibatches, lr 8e-4, temperature 1.5: 2-4x the testbed's clipped fraction."""
    step = _first_step(tmp_path, _arm("algo.clip_high=0.2", "rollout.temperature=1.5"))
    assert step["policy/clipfrac"] >= CLIP_BINDS, step["policy/clipfrac"]


def test_the_cap_truncates_in_the_overlong_regime(tmp_path):
    """An 80-token cap on the shipped start (built at 160): measured 0.168 truncated at step 1; 0.0 at 160."""
    step = _first_step(tmp_path, [*_arm("algo.overlong_penalty=0.0"), "trainer.lr=1e-9"])
    assert step["rollout/truncated_frac"] >= _floor("overlong"), step["rollout/truncated_frac"]


def test_ratios_leave_one_at_two_passes(tmp_path):
    """GRPO at 2 passes of 4 minibatches: the ratio moves after the first optimizer step (approx KL > 0)."""
    step = _first_step(tmp_path, ["algo=grpo"])
    assert step["policy/approx_kl"] >= _floor("ratio"), step["policy/approx_kl"]
    assert step["policy/clipfrac"] > 0
