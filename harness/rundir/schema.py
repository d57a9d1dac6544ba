"""The run-directory schema: what harness writes and analysis reads, shared by both.

A run directory holds ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON
object per line, each with a ``step``), ``run.json`` (status and provenance) and
``checkpoints/`` (and ``evals/``: scores of its checkpoints after training). This module knows only that format; it imports nothing of the harness
(analysis depends on it, never on harness.config).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RUN_FILES = ("run.json", "metrics.jsonl", "config.yaml")
VLLM_KEYS = ("dtype", "gpu_memory_utilization", "tensor_parallel_size", "max_num_seqs", "max_model_len", "enable_sleep_mode",
             "sleep_level", "enforce_eager", "kv_cache_gib", "weight_bucket_mb", "weight_transport")
SERVER_KEYS = {"url": "url", "url_retry_s": "retry_s", "url_connect_s": "connect_s", "url_timeout_s": "timeout_s",
               "url_weights_dir": "weights_dir"}


# Config keys added after run directories were first written, with the value that reproduces what
# those older runs did: readers fill them in, so an old run and a new one of one setting pool.
ADDED_KEYS: dict[str, Any] = {
    "correction.name": "none",  # the correction group (2026-12-07); before it, rollout.tis_cap (flat_config translates)
    "correction.cap": 2.0,
    "correction.low": 0.0,
    "correction.exclude_rejected": False,
    "model.lora.rank": 0,  # LoRA (2026-12-01): older runs fully fine-tuned
    "model.lora.alpha": 16.0,
    "model.lora.dropout": 0.0,
    "model.lora.target_modules": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    "model.lora.roles": (),
    "trainer.micro_batch_tokens": 0,  # token-budgeted micro-batches and packing (2026-12-01)
    "trainer.pack_sequences": False,
    "env.name": "",  # environments (2026-12-01): older runs were single-turn
    "env.max_turns": 4,
    "env.max_turn_tokens": 0,
    "env.demo_frac": 0.15,
    "model.tiny.sft_min_steps": 200,  # the warm-start sizing rule (2026-12-02)
    "model.tiny.sft_accuracy_floor": 0.12,
    "model.tiny.sft_max_steps": 3000,
    "model.tiny.tie_embeddings": True,  # the reasoning testbed's start (2026-12-02)
    "model.tiny.sft_direct_frac": 0.0,
    "logging.kl_from_start": False,
    "rollout.server.token_file": "",  # the rollout server's shared token (2026-12-02)
    "algo.entropy_token_frac": 0.0,  # high-entropy-token updates (2026-12-02): older runs trained every token
    "teacher.sft_steps": 2000,  # the tiny teacher, a model role with init 'tiny' (2026-12-03); = TeacherConfig()
    "teacher.hidden_size": 0,
    "teacher.num_layers": 0,
    "teacher.intermediate_size": 0,
}


# Config keys renamed since run directories were first written (old -> new): readers translate an old run's
# keys, so old and new runs of one setting pool and resume; a command line with an old key is refused,
# naming the new one (harness.config.check_renamed). vLLM-only and rollout-server settings got groups
# of their own (2026-12-02).
RENAMED_KEYS: dict[str, str] = {
    **{f"rollout.{k}": f"rollout.vllm.{k}" for k in VLLM_KEYS},
    **{f"rollout.{old}": f"rollout.server.{new}" for old, new in SERVER_KEYS.items()},
}


def staleness_bound(mode: str, max_staleness: int) -> int:
    """How many policy versions a trained batch may lag under ``trainer.pipeline=mode``: 0 for sync (and for
    async with ``max_staleness`` 0, which runs sync's computation), 1 for one_step_off, K for async."""
    return {"sync": 0, "one_step_off": 1}.get(mode, int(max_staleness))


def pipeline_record(mode: str, max_staleness: int, behaviour_logp: str, correction: str, cap: float,
                    partial: str = "off", partial_chunk_tokens: int = 0) -> dict[str, Any]:  # fmt: skip
    """run.json's ``pipeline``: what ``trainer.pipeline`` meant for a run, and ``label``, the report's column
    (``sync``, ``one_step_off (old_logp behaviour)``, ``async K=2 (old_logp recompute, tis 2)``,
    ``async K=2 (old_logp behaviour, partial continue/64)``)."""
    bound = staleness_bound(mode, max_staleness)
    label = "sync" if bound == 0 else "one_step_off" if mode == "one_step_off" else f"async K={bound}"
    extras = [f"old_logp {behaviour_logp}"] if bound > 0 else []
    correction = f"{correction} {float(cap):g}" if correction != "none" else "none"
    extras += [correction] if correction != "none" else []
    partial = partial if bound > 0 else "off"
    extras += [f"partial {partial}/{partial_chunk_tokens}"] if partial != "off" else []
    return {"mode": mode, "max_staleness": bound, "behaviour_logp": behaviour_logp if bound > 0 else "current weights",
            "correction": correction, "partial": partial,
            **({"partial_chunk_tokens": partial_chunk_tokens} if partial != "off" else {}),
            "label": label + (f" ({', '.join(extras)})" if extras else "")}  # fmt: skip


def budget_spec(trainer: Mapping[str, object]) -> str:
    """The budget that ends a run, as shown in tables: 'steps=500', 'tokens=2000000', 'wall_s=600'."""
    kind = trainer.get("budget") or "steps"  # configs written before budgets existed: steps
    limit = {"steps": trainer.get("steps"), "tokens": trainer.get("budget_tokens"), "wall_s": trainer.get("budget_wall_s")}[kind]
    return f"{kind}={limit:g}" if isinstance(limit, float) else f"{kind}={limit}"


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists become tuples (hashable, comparable)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = tuple(d) if isinstance(d, list) else d
    return out


def flat_config(d: Any) -> dict[str, Any]:
    """A run's config flattened, old keys under their new names (``RENAMED_KEYS``), and the keys the schema
    gained since (``ADDED_KEYS``) filled in where an older run directory lacks them."""
    flat = {RENAMED_KEYS.get(k, k): v for k, v in flatten(d).items()}
    if "rollout.tis_cap" in flat:  # before the correction group (2026-12-07): rollout.tis_cap > 0 turned it on
        cap = float(flat.pop("rollout.tis_cap") or 0.0)
        name = str(flat.pop("rollout.correction", "tis") or "tis")
        flat["correction.name"] = name if cap > 0 else "none"
        flat["correction.cap"] = cap if cap > 0 else 2.0
        flat["correction.low"] = float(flat.pop("rollout.correction_low", 0.0) or 0.0)
    if ("model.tiny.sft_accuracy_floor" not in flat and flat.get("model.tiny.sft_steps") == 200
            and flat.get("task.name") == "arith"):  # fmt: skip
        # before the sizing rule the default was 200 fixed SFT steps; on arith the rule's default
        # (sft_steps=-1) stops at 200 and builds the same shipped start
        flat["model.tiny.sft_steps"] = -1
    return {**ADDED_KEYS, **flat}


class MetricsError(ValueError):
    """A metrics.jsonl line that is neither valid nor the torn last line of a killed run."""


def read_metrics(path: str | Path, strict: bool = True) -> list[dict]:
    """Parsed metrics.jsonl lines. A torn *last* line (a run killed mid-write) is always
    dropped; another bad line raises MetricsError (``strict``) or is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1 or not strict:
                continue
            raise MetricsError(f"corrupt metrics.jsonl line {i + 1}: {exc.msg}") from None
        if not isinstance(row, dict) or "step" not in row:
            if not strict:
                continue
            raise MetricsError(f"metrics.jsonl line {i + 1} is not an object with a 'step'")
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- evaluations after training
# `harness eval SWEEP_DIR` scores a run's checkpoints into RUN/evals/<step_N>/<protocol dir>/, each an eval
# run directory (run.json kind "eval", metrics.jsonl); the report reads them as extra columns.
EVALS_DIR = "evals"


def eval_dir_name(samples: int, temperature: float, overrides: list[str]) -> str:
    """The folder of one evaluation setting below RUN/evals/<step_N>/: everything that decides its numbers
    (samples, temperature, and the command line's other overrides, sorted; '/' written as '_')."""
    rest = sorted(o.replace("/", "_") for o in overrides if o.split("=", 1)[0] != "rollout.temperature")
    return ",".join([f"samples={samples}", f"T={0.0 if samples == 1 else temperature:g}", *rest])


def protocol_scores(samples: int, temperature: float) -> dict[str, str]:
    """protocol label -> metric name (below eval/<task>/) of the scores one eval setting yields:
    greedy@1 for one sample; mean@K, pass@K and maj@K at temperature T for K samples."""
    if samples == 1:
        return {"greedy@1": "accuracy"}
    t = f"T={temperature:g}"
    return {f"mean@{samples} {t}": "accuracy", f"pass@{samples} {t}": f"pass@{samples}", f"maj@{samples} {t}": f"maj@{samples}"}


def protocol_samples(name: str) -> int:
    """Samples per prompt a protocol name needs: greedy (or greedy@1) -> 1; mean@K, pass@K, maj@K -> K."""
    m = re.fullmatch(r"(greedy)(?:@1)?|(mean|pass|maj)@(\d+)", name.strip())
    if not m:
        raise ValueError(f"protocol {name!r}: use greedy, mean@K, pass@K or maj@K (K samples per prompt)")
    if m.group(1):
        return 1
    k = int(m.group(3))
    if k < 2:
        raise ValueError(f"protocol {name!r}: K must be >= 2 ({m.group(2)}@1 is one sample: use greedy)")
    return k


def protocol_kind(name: str) -> str:
    """greedy | mean | pass | maj of a protocol name or label ('maj@8 T=1' -> maj)."""
    return name.strip().split("@")[0]
