"""Benchmark: one generate call vs the same rollout in segments (``rollout.partial``), no weight push.

    python bench/bench_segments.py [--reps 5] [--chunks 16,32,64] [KEY=VALUE overrides...]

Partial rollouts generate ``rollout.partial_chunk_tokens`` tokens per sequence at a time, so that a
weight push can go through between two segments. With no push this costs a re-prefill of each
unfinished sequence per segment; it may also save work: an hf ``generate`` call computes every row
until the longest ends, while a new segment carries only the unfinished rows. Which wins depends on
the spread of response lengths. On one fixed batch of prompts (training sampling, the run's own seed
stream), alternates the one-call rollout with each chunk size, ``--reps`` times after a warm-up,
and prints the median seconds and generated tokens/s of each, the ratio to one call, and the
batch's response lengths (median, p90, max: the long tail). Same config keys as ``harness run``
(e.g. ``rollout=vllm`` from .venv-vllm).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> None:
    import algorithms
    import rewards
    from harness.config import compose_config, runtime_settings, validate
    from harness.data.tasks import load_task
    from harness.models import resolve_model
    from harness.runtime.driver.hybrid_engine import HybridEngine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--chunks", default="16,32,64", help="rollout.partial_chunk_tokens values, comma-separated")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    base = ["trainer.pipeline=async", "rollout.partial=continue", *args.overrides]  # the engine of a partial run
    cfg = compose_config(base)
    sizes = validate(cfg)
    algo, task = algorithms.build(cfg.algo), load_task(cfg.task)
    path, _ = resolve_model(cfg.model, task, rewards.get(cfg.task.checker), cfg.rollout.max_response_tokens)
    settings = runtime_settings(cfg)
    engine = HybridEngine(settings, algo.needs, path, sizes, rollout_only=True)
    examples = task.train[: cfg.trainer.prompts_per_step]
    n = algo.samples_per_prompt

    def rollout(chunk: int | None) -> tuple[float, torch.Tensor]:
        engine.rng = torch.Generator().manual_seed(cfg.seed)  # the same samples' seeds on every side
        t0 = time.perf_counter()
        if chunk is None:
            batch = engine.rollout(examples, n=n)
        else:
            # one engine for every chunk size (building one per size would load the model again)
            engine.settings = dataclasses.replace(settings, rollout=dataclasses.replace(settings.rollout,
                                                                                          partial_chunk_tokens=chunk))
            with engine.interruptible(lambda: 0):  # segments, no push ever waiting
                batch = engine.rollout(examples, n=n)
        return time.perf_counter() - t0, batch.response_mask.sum(1)

    sides = [None, *chunks]
    seconds: dict = {s: [] for s in sides}
    tokens: dict = {}
    for rep in range(args.reps + 1):
        for side in sides:
            s, lengths = rollout(side)
            if rep:  # rep 0 warms up every side
                seconds[side].append(s)
            tokens[side] = lengths
    lengths = tokens[None].float()
    q = torch.quantile(lengths, torch.tensor([0.5, 0.9]))
    print(f"overrides: {' '.join(args.overrides) or '(defaults)'}; {len(examples)} prompts x {n} samples, "
          f"rollout={engine.settings.rollout.backend}, median of {args.reps}")
    print(f"response tokens: mean {lengths.mean():.1f}, median {q[0]:.0f}, p90 {q[1]:.0f}, max {lengths.max():.0f} "
          f"(cap {cfg.rollout.max_response_tokens})")
    one = statistics.median(seconds[None])
    for side in sides:
        med = statistics.median(seconds[side])
        name = "one call" if side is None else f"segments of {side}"
        print(f"  {name:<16} {med:8.3f} s  {int(tokens[side].sum()) / med:10,.0f} tokens/s  {one / med:5.2f}x")
    engine.close()


if __name__ == "__main__":
    main()
