"""Determinism, bit for bit, on one machine (docs/reproducibility.md): the guard CI runs on every machine.

For one algorithm per mechanism (a group baseline: grpo; a learned critic: ppo; dynamic sampling: dapo;
a teacher: opd), the 6-step run of the regression pins must give the same metrics (timings aside) and
the same final weights and optimizer state, bit for bit:

- run in this test process, after whatever tests this pytest worker ran before it, and again in a fresh
  subprocess with another ``PYTHONHASHSEED`` (Python's set and dict-of-str order) and no
  ``OMP_NUM_THREADS`` (pytest workers set it to 1; ``runtime.threads=1`` is what must decide);
- stopped after step 3 and resumed to step 6 in a second process, against the straight 6 steps.

A nondeterministic op, an RNG drawn without the run's seed, or a resume that restores less than the
run's state makes one of these differ. Unlike the regression pins (test_pinned_metrics.py, values within
a tolerance on any CPU kind), nothing here is recorded: both sides are computed on this machine, so the
test runs, and must pass, everywhere.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from harness.commands.cli import main
from harness.runtime.train.checkpoint_files import read_engine_state
from tests.helpers import metrics_without_timings as metrics

pytestmark = pytest.mark.integration

ALGOS = ["grpo", "ppo", "dapo", "opd"]  # group baseline, critic, dynamic sampling, teacher
RUN = ["trainer.prompts_per_step=8", "trainer.eval_every=3", "trainer.micro_batch_sequences=32", "seed=3",
       "runtime.threads=1", "teacher.sft_steps=20", "trainer.checkpoint_every=3"]  # fmt: skip


def weights_digest(run_dir: Path, step: int) -> dict[str, str]:
    """SHA-256 of every tensor of the step's checkpoint: the exported policy and the saved state
    (optimizer moments, critic, schedules)."""
    ckpt = run_dir / "checkpoints" / f"step_{step:07d}"
    tensors = {f"policy/{k}": v for k, v in load_file(ckpt / "policy" / "model.safetensors").items()}

    def walk(prefix: str, obj) -> None:
        if isinstance(obj, torch.Tensor):
            tensors[prefix] = obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{prefix}/{i}", v)

    walk("state", torch.load(ckpt / "state.pt", weights_only=True))
    walk("engine", read_engine_state(ckpt))  # every rank's shards of the weights and AdamW moments, whole
    return {k: hashlib.sha256(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
            if t.numel() else "empty" for k, t in tensors.items()}  # fmt: skip


def run_subprocess(args: list[str], hash_seed: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONHASHSEED"] = hash_seed
    done = subprocess.run(
        [sys.executable, "-m", "harness.commands.cli", "run", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def assert_same_run(a: Path, b: Path, what: str) -> None:
    rows_a, rows_b = metrics(a), metrics(b)
    for ra, rb in zip(rows_a, rows_b, strict=True):
        moved = {k: (ra.get(k), rb.get(k)) for k in ra.keys() | rb.keys() if ra.get(k) != rb.get(k)}
        assert not moved, f"{what}: step {ra.get('step')} differs: {dict(list(moved.items())[:6])}"
    wa, wb = weights_digest(a, 6), weights_digest(b, 6)
    assert wa.keys() == wb.keys(), f"{what}: other tensors saved: {sorted(wa.keys() ^ wb.keys())[:6]}"
    moved = [k for k in wa if wa[k] != wb[k]]
    assert not moved, f"{what}: {len(moved)} of {len(wa)} tensors differ at step 6, e.g. {moved[:4]}"


@pytest.mark.parametrize("name", ALGOS)
def test_six_steps_are_bitwise_reproducible(name, tmp_path):
    here, fresh, resumed = tmp_path / "here", tmp_path / "fresh", tmp_path / "resumed"
    main(["run", f"algo={name}", "trainer.steps=6", *RUN, f"run_dir={here}"])
    assert any(r.get("policy/grad_norm", 0) > 0 for r in metrics(here)), "no policy gradient: a vacuous check"
    run_subprocess([f"algo={name}", "trainer.steps=6", *RUN, f"run_dir={fresh}"], hash_seed="12345")
    assert_same_run(here, fresh, f"{name}, in this process vs a fresh one (PYTHONHASHSEED=12345)")
    # Stop at 3, then resume to 6 in another process (the checkpoint of step 3 is what carries over).
    run_subprocess([f"algo={name}", "trainer.steps=3", *RUN, f"run_dir={resumed}"], hash_seed="7")
    out = run_subprocess([f"algo={name}", "trainer.steps=6", *RUN, f"run_dir={resumed}"], hash_seed="8")
    assert "resumed from step_0000003" in out, out[-1000:]
    assert_same_run(here, resumed, f"{name}, 3 steps + resume to 6 vs 6 straight")
