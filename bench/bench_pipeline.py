"""Benchmark: trainer.pipeline sync vs one_step_off vs async (vs async with partial rollouts), and the
timing model (docs/async.md).

    python bench/bench_pipeline.py [--steps 30] [--modes sync,one_step_off,async] [KEY=VALUE overrides...]

Runs the same run (default: GRPO, tiny model, arith, hf) once per mode and prints, per mode, the
median step time and its split, the overlap fraction (generation the trainer did not wait for), the
waits on either side (the trainer's for its batch or a push; the producer's for the staleness bound
or, with partial rollouts, for the pushes and evals it let through mid-batch), the rollout's
tokens/s, the per-token staleness, and the step time the timing model
(``harness.runtime.driver.pipeline.predicted_step_s``) predicts from the sync run's phase times. Then
the model's speed-up for GPU-shaped splits (rollout a given share of a sync step). Steps 1-2
are dropped (warm-up; the pipeline's first batch is never overlapped). Modes: sync, one_step_off,
async, and async+partial (``rollout.partial=continue``; async+restart: ``restart``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


MODES = {"sync": ["trainer.pipeline=sync"], "one_step_off": ["trainer.pipeline=one_step_off"],
         "async": ["trainer.pipeline=async"], "async+partial": ["trainer.pipeline=async", "rollout.partial=continue"],
         "async+restart": ["trainer.pipeline=async", "rollout.partial=restart"]}  # fmt: skip


def run(mode: str, steps: int, overrides: list[str], work: Path) -> list[dict]:
    run_dir = work / mode.replace("+", "_")
    cmd = [sys.executable, "-m", "harness.commands.cli", "run", *MODES[mode], f"trainer.steps={steps}",
           f"trainer.eval_every={10 * steps}", "trainer.checkpoint_every=0", f"run_dir={run_dir}", *overrides]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] > 2]


def median(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else float("nan")


def main() -> None:
    from harness.runtime.driver.pipeline import predicted_step_s

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--modes", default="sync,one_step_off,async", help=f"comma-separated, sync first: {', '.join(MODES)}")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown or modes[0] != "sync":
        p.error(f"--modes {args.modes}: {'unknown ' + ', '.join(unknown) if unknown else 'sync must come first'} "
                f"(choose from {', '.join(MODES)})")
    with tempfile.TemporaryDirectory() as tmp:
        results = {mode: run(mode, args.steps, args.overrides, Path(tmp)) for mode in modes}
    sync = results["sync"]
    generate_s = median(sync, "perf/rollout_s") + median(sync, "perf/score_s")
    train_s = median(sync, "perf/logp_s") + median(sync, "perf/update_s")
    sync_s = median(sync, "perf/sync_s")
    print(f"overrides: {' '.join(args.overrides) or '(defaults)'}; {args.steps} steps, medians of steps 3-{args.steps}")
    print(f"sync phases: generate {generate_s:.3f} s, train {train_s:.3f} s, weight sync {sync_s:.3f} s")
    print(f"{'mode':<15}{'step s':>8}{'predicted':>11}{'vs sync':>9}{'overlap':>9}{'wait rollout':>14}"
          f"{'rollout idle':>14}{'tokens/s':>10}{'staleness':>11}{'current':>9}{'interrupts':>12}")  # fmt: skip
    base = median(sync, "perf/step_s")
    out = {}
    for mode, rows in results.items():
        step = median(rows, "perf/step_s")
        pred = predicted_step_s(generate_s, train_s, sync_s, mode.split("+")[0])
        stale = statistics.mean(r.get("rollout/staleness_mean", 0.0) for r in rows)
        current = statistics.mean(r.get("rollout/current_version_frac", 1.0 if stale == 0 else 0.0) for r in rows)
        idle = statistics.median(r.get("perf/wait_train_s", 0.0) + r.get("perf/rollout_yield_s", 0.0) for r in rows)
        generating_s = sum(r["perf/rollout_s"] - r.get("perf/rollout_yield_s", 0.0) for r in rows)  # not the pushes let in
        tokens_s = sum(r["rollout/generated_tokens"] for r in rows) / generating_s
        interrupts = sum(r.get("rollout/partial_interrupts", 0) for r in rows)
        out[mode] = {"step_s": step, "predicted_s": pred, "overlap_frac": median(rows, "perf/overlap_frac"),
                     "wait_rollout_s": median(rows, "perf/wait_rollout_s"), "rollout_idle_s": idle,
                     "rollout_tokens_per_s": tokens_s, "staleness_mean": stale, "current_version_frac": current,
                     "interrupts": interrupts, "generate_s": median(rows, "perf/rollout_s")}  # fmt: skip
        print(f"{mode:<15}{step:>8.3f}{pred:>11.3f}{base / step:>8.2f}x{median(rows, 'perf/overlap_frac'):>9.2f}"
              f"{median(rows, 'perf/wait_rollout_s'):>14.3f}{idle:>14.3f}{tokens_s:>10.0f}{stale:>11.2f}"
              f"{current:>9.2f}{interrupts:>12}")  # fmt: skip
    print("timing model, GPU-shaped splits (sync step = 1; weight sync 2% of it):")
    for share in (0.5, 0.6, 0.7, 0.8, 0.9):
        g, t, s = share * 0.98, (1 - share) * 0.98, 0.02
        print(f"  rollout {share:.0%} of the step: pipelined step {predicted_step_s(g, t, s, 'async'):.3f} "
              f"-> speed-up {1 / predicted_step_s(g, t, s, 'async'):.2f}x")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
