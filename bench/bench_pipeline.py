"""Benchmark: trainer.pipeline sync vs one_step_off vs async, and the timing model (docs/async.md).

    python bench/bench_pipeline.py [--steps 30] [KEY=VALUE overrides...]

Runs the same run (default: GRPO, tiny model, arith, hf) once per pipeline and prints, per
pipeline, the median step time and its split, the overlap fraction (generation the trainer did
not wait for), the waits on either side, and the step time the timing model
(``harness.runtime.driver.pipeline.predicted_step_s``) predicts from the sync run's phase times. Then
the model's speed-up for GPU-shaped splits (rollout a given share of a sync step). Steps 1-2
are dropped (warm-up; the pipeline's first batch is never overlapped).
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


def run(pipeline: str, steps: int, overrides: list[str], work: Path) -> list[dict]:
    run_dir = work / pipeline
    cmd = [sys.executable, "-m", "harness.cli", "run", f"trainer.pipeline={pipeline}", f"trainer.steps={steps}",
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
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {mode: run(mode, args.steps, args.overrides, Path(tmp)) for mode in ("sync", "one_step_off", "async")}
    sync = results["sync"]
    generate_s = median(sync, "perf/rollout_s") + median(sync, "perf/score_s")
    train_s = median(sync, "perf/logp_s") + median(sync, "perf/update_s")
    sync_s = median(sync, "perf/sync_s")
    print(f"overrides: {' '.join(args.overrides) or '(defaults)'}; {args.steps} steps, medians of steps 3-{args.steps}")
    print(f"sync phases: generate {generate_s:.3f} s, train {train_s:.3f} s, weight sync {sync_s:.3f} s")
    print(f"{'pipeline':<14}{'step s':>8}{'predicted':>11}{'vs sync':>9}{'overlap':>9}{'wait rollout':>14}"
          f"{'wait train':>12}{'staleness':>11}")  # fmt: skip
    base = median(sync, "perf/step_s")
    out = {}
    for mode, rows in results.items():
        step = median(rows, "perf/step_s")
        pred = predicted_step_s(generate_s, train_s, sync_s, mode)
        stale = statistics.mean(r.get("rollout/staleness_mean", 0.0) for r in rows)
        out[mode] = {"step_s": step, "predicted_s": pred, "overlap_frac": median(rows, "perf/overlap_frac"),
                     "staleness_mean": stale}  # fmt: skip
        print(f"{mode:<14}{step:>8.3f}{pred:>11.3f}{base / step:>8.2f}x{median(rows, 'perf/overlap_frac'):>9.2f}"
              f"{median(rows, 'perf/wait_rollout_s'):>14.3f}{median(rows, 'perf/wait_train_s'):>12.3f}{stale:>11.2f}")  # fmt: skip
    print("timing model, GPU-shaped splits (sync step = 1; weight sync 2% of it):")
    for share in (0.5, 0.6, 0.7, 0.8, 0.9):
        g, t, s = share * 0.98, (1 - share) * 0.98, 0.02
        print(f"  rollout {share:.0%} of the step: pipelined step {predicted_step_s(g, t, s, 'async'):.3f} "
              f"-> speed-up {1 / predicted_step_s(g, t, s, 'async'):.2f}x")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
