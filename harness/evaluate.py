"""``harness eval``: score a model on a task's test split, written as a run directory.

    harness eval model.path=Qwen/Qwen2.5-0.5B-Instruct task=math500 samples=8

Samples ``samples`` responses per prompt (greedy when samples == 1 and
rollout.temperature is left at its eval default of 0), scores them with the task's
checker, and reports accuracy (mean@k: the mean correctness over all samples), the
unbiased pass@k (Chen et al. 2021) for k = 1, 2, 4, ... <= samples, and for MATH the
same per subject and per level. The run directory holds config.yaml, run.json,
metrics.jsonl (one line, step 0) and samples.jsonl (every response with its verdict),
so `harness report` reads it like a training run.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import torch
from rich.console import Console
from rich.progress import track

import rewards
from harness.models import load_causal_lm, load_tokenizer, resolve_model
from harness.results import RunDir
from harness.runtime.rollout_hf import HFRollout
from harness.runtime.worker import resolve_device
from harness.tasks import load_task, render_prompt
from rewards.evaluate import pass_at_k


def _ks(samples: int) -> list[int]:
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 2
    return ks if ks[-1] == samples else ks + [samples]


def summarise(correct: list[list[bool]], prefix: str) -> dict[str, float]:
    """mean@k accuracy and unbiased pass@k over prompts, each with n samples."""
    n = len(correct[0]) if correct else 0
    out: dict[str, float] = {f"{prefix}/prompts": float(len(correct))}
    if not correct:
        return out
    out[f"{prefix}/accuracy"] = sum(sum(c) for c in correct) / (n * len(correct))
    for k in _ks(n):
        out[f"{prefix}/pass@{k}"] = sum(pass_at_k(n, sum(c), k) for c in correct) / len(correct)
    return out


def evaluate_model(cfg: Any, run_dir: str, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    if cfg.runtime.threads > 0:
        torch.set_num_threads(cfg.runtime.threads)
    run = RunDir(run_dir, cfg)
    checker = rewards.get(cfg.task.checker)
    task = load_task(cfg.task)
    examples = task.test[: cfg.eval_limit] if cfg.eval_limit else task.test
    model_path, model_info = resolve_model(cfg.model, task, checker, cfg.rollout.max_response_tokens, console)
    run.start(cfg, checker.tag, model_info)
    run.write_info(kind="eval")
    device = resolve_device(cfg.runtime.device)
    torch.manual_seed(cfg.seed)
    tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
    model = load_causal_lm(model_path, "float32" if device == "cpu" else cfg.model.dtype, cfg.model.trust_remote_code)
    backend = HFRollout(model.to(device), tokenizer, cfg.task.max_prompt_tokens)
    samples = int(cfg.samples)
    temperature = cfg.rollout.temperature if samples > 1 else 0.0
    max_tokens = cfg.rollout.eval_max_response_tokens or cfg.rollout.max_response_tokens
    batch_prompts = max(1, cfg.trainer.micro_batch_sequences // samples)
    t0 = time.perf_counter()
    correct: list[list[bool]] = []
    tokens = 0
    with (run.path / "samples.jsonl").open("w") as out:
        for start in track(range(0, len(examples), batch_prompts), description="eval", console=console):
            chunk = examples[start : start + batch_prompts]
            prompts = [render_prompt(ex.messages, tokenizer, cfg.task.use_chat_template) for ex in chunk]
            gen = backend.generate(prompts, samples, max_tokens, temperature, cfg.rollout.top_p)
            responses = backend.decode(gen.response_ids, gen.response_mask)
            tokens += int(gen.response_mask.sum())
            truths = [chunk[g].ground_truth for g in gen.group_ids.tolist()]
            verdicts = checker.score_batch(responses, truths)
            for i, ex in enumerate(chunk):
                vs = verdicts[i * samples : (i + 1) * samples]
                correct.append([v.correct for v in vs])
                for v, r in zip(vs, responses[i * samples : (i + 1) * samples]):
                    row = {"index": start + i, "response": r, "ground_truth": ex.ground_truth, **ex.meta,
                           "correct": v.correct, "extracted": v.extracted, "reason": v.reason}
                    out.write(json.dumps(row) + "\n")
    prefix = f"eval/{task.name}"
    metrics = {"step": 0, **summarise(correct, prefix)}
    for field in ("subject", "level"):  # MATH breakdowns
        groups: dict[str, list[list[bool]]] = defaultdict(list)
        for ex, c in zip(examples, correct):
            if ex.meta.get(field):
                groups[str(ex.meta[field])].append(c)
        for value, rows in sorted(groups.items()):
            metrics |= summarise(rows, f"{prefix}/{field}={value}")
    run.truncate_metrics(-1)
    run.log(metrics)
    wall = time.perf_counter() - t0
    acc = metrics.get(f"{prefix}/accuracy", float("nan"))
    run.write_info(status="finished", wall_s=round(wall, 2), generated_tokens=tokens, eval_first=acc,
                   eval_final=acc, eval_best=acc, eval_metric=f"{prefix}/accuracy", samples=samples)
    console.print(
        f"[bold green]eval[/] {task.name}: accuracy (mean@{samples}) {acc:.4f}, "
        + ", ".join(f"pass@{k} {metrics[f'{prefix}/pass@{k}']:.4f}" for k in _ks(samples))
        + f" on {len(examples)} prompts; checker {checker.tag}; results in {run.path}"
    )
    return metrics
