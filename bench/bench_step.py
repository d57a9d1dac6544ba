"""Benchmark: GRPO step-time split, and harness rollout throughput vs raw ``model.generate``.

    python bench/bench_step.py [--steps 20] [--reps 7] [KEY=VALUE overrides...]

1. Runs ``--steps`` GRPO steps of the default config (tiny model, arith) and prints the
   median split of a step: rollout, scoring, log-probs (reference/old), update, weight sync.
2. On one fixed batch of prompts, alternates A/B/A/B the harness rollout
   (``HybridEngine.rollout``: render, tokenize, generate, mask, decode) and a bare
   ``model.generate`` call with the same sampling settings, and prints generated tokens/s
   of each and the ratio (target >= 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def compose(overrides):
    from harness.config import compose_config

    return compose_config(overrides)


def step_split(overrides, steps):
    from rich.console import Console

    from harness.trainer import train

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose([*overrides, f"trainer.steps={steps}", f"trainer.eval_every={steps}"])
        train(cfg, run_dir, console=Console(quiet=True))
        rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))][2:]  # skip eval + warm-up
    keys = ["perf/step_s", "perf/rollout_s", "perf/score_s", "perf/logp_s", "perf/update_s", "perf/sync_s"]
    return {k: statistics.median(r[k] for r in rows) for k in keys}, statistics.median(
        r["perf/rollout_tokens_per_s"] for r in rows
    )


def rollout_ab(overrides, reps):
    import algorithms
    import rewards
    from harness.config import runtime_settings, validate
    from harness.data.tasks import load_task
    from harness.models import resolve_model
    from harness.runtime.driver.hybrid_engine import HybridEngine
    from harness.runtime.rollout.base import encode_prompts

    cfg = compose(overrides)
    sizes = validate(cfg)
    algo = algorithms.build(cfg.algo)
    task = load_task(cfg.task)
    path, _ = resolve_model(cfg.model, task, rewards.get(cfg.task.checker), cfg.rollout.max_response_tokens)
    engine = HybridEngine(runtime_settings(cfg), algo.needs, path, sizes)
    examples = task.train[: cfg.trainer.prompts_per_step]
    n, r = algo.samples_per_prompt, cfg.rollout
    model, tok = engine.rollout_backend.model, engine.tokenizer
    ids, mask = encode_prompts(tok, engine.render(examples))

    def harness_side():
        batch = engine.rollout(examples, n=n)
        return int(batch.response_mask.sum())

    def raw_side():
        out = model.generate(
            input_ids=ids, attention_mask=mask.long(), do_sample=True, temperature=r.temperature, top_p=r.top_p,
            top_k=0, max_new_tokens=r.max_response_tokens, num_return_sequences=n,
            pad_token_id=tok.pad_token_id, eos_token_id=engine.rollout_backend.eos_ids,
        )
        new = out[:, ids.shape[1]:]
        from harness.runtime.rollout.base import response_mask_from_ids

        return int(response_mask_from_ids(new, engine.rollout_backend.eos_ids)[0].sum())

    rates = {"harness": [], "raw": []}
    for rep in range(reps + 1):
        for name, fn in (("harness", harness_side), ("raw", raw_side)):
            torch.manual_seed(rep)
            t0 = time.perf_counter()
            tokens = fn()
            if rep:  # rep 0 warms up both
                rates[name].append(tokens / (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    split, tps = step_split(args.overrides, args.steps)
    print(f"GRPO step split (median of {args.steps - 1} steps, {torch.get_num_threads()} threads):")
    for k, v in split.items():
        share = f"{100 * v / split['perf/step_s']:5.1f}%" if k != "perf/step_s" else "      "
        print(f"  {k:<16} {v * 1000:8.1f} ms {share}")
    print(f"  rollout tokens/s in training: {tps:,.0f}")
    ab = rollout_ab(args.overrides, args.reps)
    print(f"Rollout A/B on one batch (median of {args.reps}):")
    print(f"  harness rollout  {ab['harness']:10,.0f} tokens/s")
    print(f"  raw generate     {ab['raw']:10,.0f} tokens/s")
    print(f"  ratio harness/raw = {ab['harness'] / ab['raw']:.3f} (target >= 0.9)")


if __name__ == "__main__":
    sys.exit(main())
