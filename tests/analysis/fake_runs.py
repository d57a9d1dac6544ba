"""Realistic fake run directories (config.yaml, run.json, metrics.jsonl as the trainer writes them)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np
import yaml

ALGO_DEFAULTS = {
    "grpo": {"loss_agg": "seq_mean_token_mean", "kl_coef": 0.04, "kl_kind": "k3", "scale_by_std": True,
             "samples_per_prompt": 8},
    "dr_grpo": {"loss_agg": "seq_mean_token_sum_norm", "kl_coef": 0.0, "kl_kind": "k3", "scale_by_std": False,
                "samples_per_prompt": 8},
    "rloo": {"loss_agg": "seq_mean_token_sum", "kl_coef": 0.0, "kl_kind": "k1", "samples_per_prompt": 8},
    "ppo": {"loss_agg": "token_mean", "kl_coef": 0.001, "kl_kind": "k1", "samples_per_prompt": 8},
}


def make_run(root: str | Path, algo: str = "grpo", seed: int = 0, task: str = "arith", steps: int = 10,
             eval_every: int = 5, final_acc: float = 0.5, start_acc: float = 0.1, prompts_per_step: int = 4,
             max_response_tokens: int = 16, checker: str | None = None, status: str = "finished",
             tokens_per_step: int = 400, step_s: float = 0.5, extra_algo: dict | None = None,
             name: str | None = None, trainer: dict | None = None, warm_start: str = "ab12" * 16,
             lora_rank: int = 0, legacy: bool = False, env: str = "", pipeline: str = "",
             reward: dict | None = None, acc_curve: tuple[float, float, float] | None = None,
             mismatch: tuple[float, float, float] | None = None) -> Path:
    """Write one run directory under ``root`` and return it. Accuracy rises linearly to ``final_acc``, or
    with ``acc_curve=(A, B, C_mid)`` follows ScaleRL's sigmoid in generated tokens from ``start_acc``.
    ``mismatch=(gap, ess, dropped)``: every step logs them (rollout/logp_gap_mean, mismatch/ess,
    rollout/correction_dropped_frac), as a run whose rollout log-probs reach the trainer does."""
    a = {"name": algo, "epochs": 1, "clip_low": 0.2, "clip_high": 0.2, "entropy_coef": 0.0,
         **ALGO_DEFAULTS.get(algo, ALGO_DEFAULTS["rloo"]), **(extra_algo or {})}
    cfg = {
        "algo": a,
        "task": {"name": task, "checker": task, "eval_prompts": 8, "train_size": 400},
        "model": {"path": "tiny", "dtype": "float32", "tiny": {"sft_steps": 20, "cache_dir": "~/.cache"},
                  "lora": {"rank": lora_rank, "alpha": 16.0}},
        "rollout": {"backend": "hf", "temperature": 1.0, "top_p": 1.0, "max_response_tokens": max_response_tokens},
        "trainer": {"steps": steps, "prompts_per_step": prompts_per_step, "lr": 2e-4, "eval_every": eval_every,
                    **(trainer or {})},
        "runtime": {"workers": 1, "threads": 0},
        "seed": seed, "run_dir": "", "plugins": [],
    }
    if reward:
        cfg["reward"] = reward
    if env:
        cfg["env"] = {"name": env, "max_turns": 4, "max_turn_tokens": 0, "demo_frac": 0.15}
    if pipeline:
        cfg["trainer"] |= {"pipeline": pipeline, "max_staleness": 2, "behaviour_logp": "behaviour"}
    if legacy:  # as written before model.lora existed
        del cfg["model"]["lora"]
    d = Path(root) / (name or f"algo={algo},seed={seed},task={task}")
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rng = np.random.default_rng(zlib.crc32(f"{algo}/{seed}/{task}".encode()))
    key = f"eval/{task}/accuracy"
    lines = [{"step": 0, key: start_acc, f"eval/{task}/response_tokens_mean": 5.0}]
    evals = [start_acc]
    done = steps if status == "finished" else steps // 2
    for s in range(1, done + 1):
        row = {
            "step": s, "reward/mean": 0.1 + 0.04 * s, "reward/accuracy": 0.1 + 0.04 * s,
            "rollout/response_tokens_mean": 6.0 + rng.normal(0, 0.5), "rollout/truncated_frac": 0.0,
            "rollout/response_tokens_correct_mean": 5.0, "rollout/response_tokens_incorrect_mean": 7.0 + 0.1 * s,
            "rollout/zero_std_group_frac": 0.5, "loss/policy": rng.normal(0, 0.01), "loss/kl": 0.001,
            "policy/clipfrac": 0.0, "policy/approx_kl": 0.0, "policy/entropy": 1.5 - 0.05 * s,
            "budget/generated_tokens": tokens_per_step * s, "budget/wall_s": step_s * s,
            "perf/step_s": step_s, "perf/rollout_s": 0.5 * step_s, "perf/score_s": 0.01 * step_s,
            "perf/logp_s": 0.1 * step_s, "perf/update_s": 0.35 * step_s, "perf/sync_s": 0.04 * step_s,
        }
        if mismatch is not None:
            row |= {"rollout/logp_gap_mean": mismatch[0], "mismatch/ess": mismatch[1],
                    "rollout/correction_dropped_frac": mismatch[2]}
        if s % eval_every == 0 or s == steps:
            acc = start_acc + (final_acc - start_acc) * s / steps
            if acc_curve is not None:
                A, B, c_mid = acc_curve
                acc = start_acc + (A - start_acc) / (1 + (c_mid / (tokens_per_step * s)) ** B)
            row[key] = acc
            row[f"eval/{task}/response_tokens_mean"] = 6.0
            if pipeline:
                row["rollout/staleness_mean"] = 1.0
            if env:
                row |= {f"eval/{task}/tool_success_frac": 0.5 + 0.5 * s / steps, f"eval/{task}/turns_mean": 1.0 + s / steps}
            evals.append(acc)
        lines.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    info = {
        "status": status, "algo": algo, "task": task, "seed": seed, "checker": checker or f"{task}@1",
        "model": "tiny", "model_info": {"params": 494464, "weights_sha256": warm_start}, "git": {"sha": "0" * 40, "dirty": False},
        "versions": {"python": "3.11"}, "started_at": "2026-01-01T00:00:00+0000", "steps_planned": steps,
    }
    trainable = 494464 if not lora_rank else 5632 * lora_rank
    info["tuning"] = {"tuning": "lora" if lora_rank else "full", "rank": lora_rank, "alpha": 16.0, "roles": [],
                      "parameters": {"policy": {"trainable": trainable, "total": 494464 + (trainable if lora_rank else 0)}}}
    if legacy:
        del info["tuning"]
    if status == "finished":
        info |= {"steps_done": steps, "wall_s": step_s * steps, "generated_tokens": tokens_per_step * steps,
                 "eval_first": evals[0], "eval_final": evals[-1], "eval_best": max(evals), "eval_metric": key}
    (d / "run.json").write_text(json.dumps(info, indent=2))
    return d


def make_sweep(root: str | Path, algos=("grpo", "rloo"), seeds=(0, 1, 2), **kw) -> Path:
    """A sweep folder: algos x seeds, grpo a bit better than the others, seeds spread a little."""
    root = Path(root)
    for i, algo in enumerate(algos):
        for seed in seeds:
            make_run(root, algo=algo, seed=seed, final_acc=0.6 - 0.1 * i + 0.02 * seed, **kw)
    return root
