"""Collect run directories (run.json + metrics.jsonl + config.yaml) into tidy frames.

A run directory is any directory holding ``run.json``, ``metrics.jsonl`` or
``config.yaml`` (Hydra's ``.hydra/`` and ``checkpoints/`` folders are not walked).
Runs that cannot be used (unfinished, eval-only, corrupt or missing files, no eval
lines) are never fatal: they are returned in ``Collection.skipped`` with the reason.

Frames:

- ``runs``: one row per usable run (identity, the knobs that silently change results,
  budget, first/final/best eval, area under the learning curve, median step times).
- ``metrics``: one row per run per step (every metric of metrics.jsonl as a column,
  ``eval_acc`` for the run's eval metric, plus the run's identity columns).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from analysis.columns import RunRecord, read_values
from harness.rundir.schema import (
    EVALS_DIR,
    RUN_FILES,
    MetricsError,
    budget_spec,
    flat_config,
    pipeline_record,
    protocol_scores,
    read_metrics,
)

NOT_WALKED = {".hydra", "checkpoints", EVALS_DIR, "report", "__pycache__", ".git"}
# Columns of ``runs`` holding the final checkpoint's scores from `harness eval SWEEP_DIR`: "<prefix><label>, N prompts".
AFTER_PREFIX = "final ckpt "
PERF_KEYS = ("rollout", "score", "logp", "update", "sync")
# Config keys that define the compute budget: runs differing here are not comparable.
BUDGET_KEYS = ("budget", "steps", "prompts_per_step", "samples_per_prompt", "max_response_tokens")
# Config keys never treated as a "variant" (they differ between seeds/locations, or are shown elsewhere).
IGNORED_VARIANT_KEYS = {
    "seed", "run_dir", "plugins", "runtime.threads", "runtime.launcher", "runtime.device",
    "model.tiny.cache_dir", "samples", "eval_limit",
    # how a tiny warm start was built: the warm_start column (its weights' hash) keeps different starts apart
    "model.tiny.sft_steps", "model.tiny.sft_min_steps", "model.tiny.sft_accuracy_floor", "model.tiny.sft_max_steps",
    "model.tiny.tie_embeddings", "model.tiny.sft_direct_frac",
    # a random-reward control is labelled as one (CONTROL_LABEL), not by these keys
    "reward.source", "reward.random_rate",
}
# The variant label of a control run: what it gains without the checker's information (a report marks it).
CONTROL_PREFIX = "control: "


COMPOSITION_KEYS = ("algo.advantage", "algo.loss")  # parts in place of the algorithm's own (algorithms/parts.py)


def composition_label(flat: dict[str, Any]) -> str:
    """'advantage=rloo, loss=gspo' for a run that swapped an algorithm's parts, '' otherwise: always shown,
    so a row never carries a plain algorithm name for a composition."""
    return ", ".join(f"{k.split('.')[1]}={flat[k]}" for k in COMPOSITION_KEYS if flat.get(k))


def control_label(flat: dict[str, Any]) -> str:
    """'control: random reward p=0.3' for a reward.source=random run, else ''."""
    if flat.get("reward.source") != "random":
        return ""
    return f"{CONTROL_PREFIX}random reward p={flat.get('reward.random_rate', 0.5):g}"


@dataclass
class Collection:
    runs: pd.DataFrame
    metrics: pd.DataFrame
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (run dir, reason)
    # One row per score of an evaluation after training (harness eval SWEEP_DIR): run, checkpoint step,
    # protocol, prompts, temperature, value and its 95% interval over prompts.
    evals: pd.DataFrame = field(default_factory=pd.DataFrame)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_dir -> its flat config (flat_config)


class SkipRun(Exception):
    """This directory is not a usable finished training run (the message says why)."""


def find_run_dirs(roots: list[str | Path]) -> tuple[list[Path], list[tuple[str, str]]]:
    """Every directory under ``roots`` that holds a run file (deduplicated, sorted)."""
    found: set[Path] = set()
    missing: list[tuple[str, str]] = []
    for root in roots:
        root = Path(root)
        if not root.exists():
            missing.append((str(root), "does not exist"))
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in NOT_WALKED)
            if any(f in filenames for f in RUN_FILES):
                found.add(Path(dirpath).resolve())
    return sorted(found), missing


def describe(algo: str, info: dict, cfg: dict) -> dict:
    """The algorithm's own description of its knobs (``Algorithm.describe``): recorded in run.json
    by the run; for runs written before that, asked of the algorithm built from the run's config,
    else the registered class's static metadata ({} when the class is not importable: a plugin not
    loaded, torch missing; the report still works)."""
    if isinstance(info.get("algorithm"), dict):
        return info["algorithm"]
    try:
        from omegaconf import OmegaConf

        import algorithms

        return algorithms.build(OmegaConf.create(cfg["algo"])).describe()
    except Exception:
        pass
    try:
        import algorithms

        cls = algorithms.get_class(algo)
        return {**cls.metadata, "kl_placement": cls.kl_placement}
    except Exception:
        return {}


def reward_label(reward: dict) -> str:
    """What the run trained on: ``checker``, ``random 0.3`` (a control), or ``model <sha12>`` / ``mix 0.5 <sha12>``
    (run.json's reward)."""
    source = reward.get("source", "checker")
    if source == "checker":
        return "checker"
    if source == "random":
        return f"random {reward.get('random_rate')}"
    sha = str((reward.get("model") or {}).get("weights_sha256") or "?")[:12]
    return f"model {sha}" if source == "model" else f"mix {reward.get('model_weight')} {sha}"


def env_label(flat: dict) -> str:
    """``none`` (single-turn; also runs from before environments existed) or ``calculator <=4 turns``."""
    name = flat.get("env.name") or ""
    if not name:
        return "none"
    per_turn = flat.get("env.max_turn_tokens") or 0
    return f"{name} <={flat.get('env.max_turns')} turns" + (f", <={per_turn} tok/turn" if per_turn else "")


def pipeline_label(info: dict, flat: dict) -> str:
    """The run's pipeline as run.json records it (``sync``, ``one_step_off (old_logp behaviour)``, ``async K=2
    (old_logp recompute, tis 2)``: harness.rundir.schema.pipeline_record); for runs written before run.json held the
    label, the same record made from their config (``sync`` for runs from before pipelines existed)."""
    label = (info.get("pipeline") or {}).get("label")
    if label:
        return str(label)
    return pipeline_record(flat.get("trainer.pipeline") or "sync", int(flat.get("trainer.max_staleness") or 0),
                           flat.get("trainer.behaviour_logp") or "behaviour", str(flat.get("correction.name") or "none"),
                           float(flat.get("correction.cap") or 2.0), flat.get("rollout.partial") or "off",
                           int(flat.get("rollout.partial_chunk_tokens") or 0))["label"]


def tuning_label(tuning: dict | None) -> str:
    """``full`` (full fine-tuning; also runs from before run.json recorded it) or ``lora r8 a16``."""
    if not tuning or tuning.get("tuning", "full") == "full":
        return "full"
    roles = "".join(f" +{r}" for r in tuning.get("roles") or [])
    return f"lora r{tuning.get('rank')} a{float(tuning.get('alpha', 0)):g}{roles}"


def auc(steps: np.ndarray, acc: np.ndarray) -> float:
    """Area under eval accuracy vs step (trapezoid), divided by the step range: a mean accuracy in [0, 1]."""
    steps, acc = np.asarray(steps, float), np.asarray(acc, float)
    ok = ~np.isnan(acc)
    steps, acc = steps[ok], acc[ok]
    if len(steps) == 0:
        return float("nan")
    if len(steps) == 1 or steps[-1] == steps[0]:
        return float(acc[-1])
    area = float(np.sum((acc[1:] + acc[:-1]) * np.diff(steps)) / 2.0)
    return area / float(steps[-1] - steps[0])


def protocol_label(info: dict, cfg: dict) -> str:
    """How a training run's eval accuracy was measured: ``greedy@1, 128 prompts`` (run.json; runs from
    before it recorded this: greedy on task.eval_prompts, which the test split may have cut short)."""
    prompts = info.get("eval_prompts") or (cfg.get("task") or {}).get("eval_prompts", "?")
    return f"{info.get('protocol') or 'greedy@1'}, {prompts} prompts"


def read_evals(run: Path) -> tuple[list[dict], list[tuple[str, str]]]:
    """The scores of every finished evaluation in RUN/evals/<step_N>/<setting>/ (harness eval SWEEP_DIR): one
    dict per protocol the evaluation was asked for; unreadable ones come back as (dir, reason)."""
    rows, skipped = [], []
    for rj in sorted((run / EVALS_DIR).glob("step_*/*/run.json")):
        d = rj.parent
        try:
            info = json.loads(rj.read_text())
            if info.get("status") != "finished":
                skipped.append((str(d), f"evaluation not finished (status {info.get('status')!r}): rerun harness eval"))
                continue
            last = read_metrics(d / "metrics.jsonl")[-1]
            samples, temperature = int(info["samples"]), float(info.get("temperature") or 0.0)
            prompts, prefix = int(info["eval_prompts"]), str(info["eval_metric"]).rsplit("/", 1)[0]
            step = int(d.parent.name.removeprefix("step_"))
        except (OSError, ValueError, KeyError, IndexError, TypeError, MetricsError) as exc:
            skipped.append((str(d), f"unreadable evaluation ({type(exc).__name__}: {exc})"))
            continue
        asked = info.get("protocols")
        for label, metric in protocol_scores(samples, temperature).items():
            if asked and label not in asked:
                continue
            key = f"{prefix}/{metric}"
            rows.append({"step": step, "protocol": label, "prompts": prompts, "temperature": temperature,
                         "column": f"{AFTER_PREFIX}{label}, {prompts} prompts", "value": float(last.get(key, np.nan)),
                         "ci_low": float(last.get(f"{key}_ci_low", np.nan)), "ci_high": float(last.get(f"{key}_ci_high", np.nan)),
                         "eval_dir": str(d)})  # fmt: skip
    return rows, skipped


def load_run(path: Path) -> tuple[dict, pd.DataFrame]:
    """(summary row, metrics frame) of one finished training run; raises SkipRun otherwise."""
    record = read_run(path)
    row = identity_row(record) | perf_row(record) | read_values(record)  # read_values: analysis/columns.py
    row["_config"] = record.flat
    return row, record.metrics


def read_run(path: Path) -> RunRecord:
    """A finished training run's files, parsed and checked; raises SkipRun with the reason otherwise."""
    rj, mj, cy = (path / f for f in RUN_FILES)
    if not rj.exists():
        raise SkipRun("no run.json")
    try:
        info = json.loads(rj.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SkipRun(f"corrupt run.json ({exc})") from None
    if not isinstance(info, dict):
        raise SkipRun("corrupt run.json (not an object)")
    if info.get("kind") == "eval":
        raise SkipRun("an eval run (harness eval), not a training run")
    status = info.get("status")
    if status != "finished":
        done, planned = info.get("steps_done"), info.get("steps_planned")
        raise SkipRun(f"partial: status {status!r}" + (f" (planned {planned} steps)" if planned else "")
                      + (f", {done} done" if done is not None else ""))
    if not cy.exists():
        raise SkipRun("no config.yaml")
    try:
        cfg = yaml.safe_load(cy.read_text())
    except yaml.YAMLError as exc:
        raise SkipRun(f"corrupt config.yaml ({str(exc).splitlines()[0]})") from None
    if not isinstance(cfg, dict) or "algo" not in cfg or "trainer" not in cfg:
        raise SkipRun("corrupt config.yaml (no algo/trainer sections)")
    if not mj.exists():
        raise SkipRun("no metrics.jsonl")
    try:
        rows = read_metrics(mj)
    except MetricsError as exc:
        raise SkipRun(str(exc)) from None
    if not rows:
        raise SkipRun("empty metrics.jsonl")
    algo = info.get("algo") or cfg["algo"].get("name")
    task = info.get("task") or cfg.get("task", {}).get("name")
    metric = info.get("eval_metric") or f"eval/{task}/accuracy"
    m = pd.DataFrame(rows)
    m = m.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)
    if metric not in m.columns or m[metric].notna().sum() == 0:
        raise SkipRun(f"no eval lines ({metric}) in metrics.jsonl")
    m["eval_acc"] = m[metric]
    # Budget columns: step 0 (initial eval) costs nothing; forward-fill to any line lacking them.
    for col in ("budget/generated_tokens", "budget/wall_s"):
        if col not in m.columns:
            m[col] = np.nan
        m.loc[m["step"] == 0, col] = m.loc[m["step"] == 0, col].fillna(0.0)
        m[col] = m[col].astype(float).ffill()

    return RunRecord(str(path), info, cfg, flat_config(cfg), algo, task, metric, m)


def identity_row(record: RunRecord) -> dict[str, Any]:
    """What a run is (algorithm, knobs that change results, budget, start, provenance) and its accuracy curve."""
    info, cfg, flat, task, m, ev = record.info, record.config, record.flat, record.task, record.metrics, record.evals
    algo, metric = record.algo, record.eval_metric
    a = cfg["algo"]
    kl_coef = float(a.get("kl_coef", 0.0) or 0.0)
    knobs = describe(algo, info, cfg)
    row: dict[str, Any] = {
        "run_dir": record.path,
        "algo": algo,
        "task": task,
        "seed": int(info.get("seed", cfg.get("seed", 0))),
        "checker": info.get("checker", "?"),
        "model": info.get("model") or cfg.get("model", {}).get("path", "?"),
        "eval_metric": metric,
        "eval_protocol": protocol_label(info, cfg),
        "loss_agg": a.get("loss_agg", "?"),
        "std_norm": str(knobs.get("normalisation", "?")),
        "kl_placement": str(knobs.get("kl_placement", "?")) if kl_coef > 0 else "none",
        "kl_coef": kl_coef,
        "kl_kind": a.get("kl_kind", ""),
        "budget": budget_spec(cfg["trainer"]),  # what ended the run: steps=N | tokens=N | wall_s=S
        "steps": int(cfg["trainer"].get("steps", info.get("steps_planned", 0))),
        "prompts_per_step": int(cfg["trainer"].get("prompts_per_step", 0)),
        "samples_per_prompt": int(a.get("samples_per_prompt", 0)),
        "max_response_tokens": int(cfg.get("rollout", {}).get("max_response_tokens", 0)),
        "lr": cfg["trainer"].get("lr"),
        "generated_tokens": float(info.get("generated_tokens") or m["budget/generated_tokens"].max()),
        "wall_s": float(info.get("wall_s") or m["budget/wall_s"].max()),
        "eval_first": float(ev["eval_acc"].iloc[0]),
        "eval_final": float(ev["eval_acc"].iloc[-1]),
        "eval_best": float(ev["eval_acc"].max()),
        "auc": auc(ev["step"].to_numpy(), ev["eval_acc"].to_numpy()),
        "last_step": int(m["step"].max()),
        # The starting weights: runs from different warm starts must never be pooled.
        "warm_start": str((info.get("model_info") or {}).get("weights_sha256") or "?")[:12],
        "git_sha": (info.get("git") or {}).get("sha"),
        "git_dirty": (info.get("git") or {}).get("dirty"),
        "started_at": info.get("started_at"),
        "reward": reward_label(info.get("reward") or {}),
        "tuning": tuning_label(info.get("tuning")),
        # Parameters the policy's optimizer trained (NaN for runs that did not record it).
        "trainable_params": float(((info.get("tuning") or {}).get("parameters") or {}).get("policy", {})
                                  .get("trainable", float("nan"))),
    }
    row["env"] = env_label(flat)  # multi-turn episodes (env.name): the environment
    row["pipeline"] = pipeline_label(info, flat)  # the rollout/training pipeline (trainer.pipeline)
    return row


def perf_row(record: RunRecord) -> dict[str, Any]:
    """Median seconds per training step (and per phase), and the mean sampled training accuracy."""
    train, row = record.train, {}
    for k in PERF_KEYS:
        col = f"perf/{k}_s"
        row[f"{k}_s"] = float(train[col].median()) if col in train.columns and len(train) else float("nan")
    acc = train["reward/accuracy"] if "reward/accuracy" in train.columns else pd.Series(dtype=float)
    row["train_accuracy"] = float(acc.mean()) if acc.notna().any() else float("nan")  # sampled, all steps
    row["step_s"] = float(train["perf/step_s"].median()) if "perf/step_s" in train.columns and len(train) else float("nan")
    return row


def _algo_defaults(name: str) -> dict[str, Any]:
    """``algo.*`` -> the registered algorithm's default, {} for one not registered here."""
    import dataclasses

    import algorithms

    try:
        cls = algorithms.get_class(name)
    except KeyError:  # a plugin not loaded in this process: no defaults known
        return {}
    return {f"algo.{k}": v for k, v in dataclasses.asdict(cls.config_class(name=name)).items()}


def _variants(runs: pd.DataFrame) -> pd.Series:
    """Per run, the config keys that differ from other runs of the same algorithm and task ('' if none).
    An ``algo.*`` key at the algorithm's registered default is left out, so the algorithm at its
    defaults keeps its plain name beside a changed-knob row ('X' and 'X [algo.clip_high=0.2]')."""
    out = pd.Series("", index=runs.index, dtype=object)
    shown = {"algo.loss_agg", "algo.kl_coef", "algo.kl_kind", "model.path", "task.checker",
             "trainer.steps", "trainer.prompts_per_step", "algo.samples_per_prompt", "rollout.max_response_tokens"}
    for _, idx in runs.groupby(["task", "algo"]).groups.items():
        cfgs = [runs.at[i, "_config"] for i in idx]
        keys = sorted(set().union(*cfgs))
        # A key missing from some configs (run dirs written before it existed) varies only if the
        # configs holding it disagree: absent means "the behaviour of the time", not another setting.
        varying = [k for k in keys if k not in IGNORED_VARIANT_KEYS and k not in shown
                   and not k.startswith(("hydra", "logging.")) and len({repr(c[k]) for c in cfgs if k in c}) > 1]
        defaults = _algo_defaults(runs.at[idx[0], "algo"]) if varying else {}  # imports algorithms: only when needed
        for i, c in zip(idx, cfgs):
            knobs = [f"{k}={c.get(k)}" for k in varying if k not in COMPOSITION_KEYS
                     and (k not in defaults or not _same(c.get(k), defaults[k]))]  # fmt: skip
            out[i] = " ".join(filter(None, [control_label(c), composition_label(c), *knobs]))
    return out


def _at_defaults(algo: str, flat: dict[str, Any]) -> bool:
    """Whether a run's ``algo.*`` settings are the algorithm's registered defaults (True when
    the algorithm is not registered here: nothing to compare with)."""
    defaults = _algo_defaults(algo)
    return all(_same(flat[k], v) for k, v in defaults.items() if k in flat and k != "algo.name")


def _same(value: Any, default: Any) -> bool:
    """A config value (from YAML: lists for tuples) equals a dataclass default."""
    if isinstance(default, tuple):
        default = list(default)
    if isinstance(value, tuple):
        value = list(value)
    return value == default


def collect(roots: list[str | Path]) -> Collection:
    """Load every run under ``roots``; unusable ones land in ``skipped`` with the reason."""
    dirs, skipped = find_run_dirs(roots)
    rows, frames, evals = [], [], []
    for d in dirs:
        try:
            row, m = load_run(d)
            scores, unreadable = read_evals(d)
        except SkipRun as exc:
            skipped.append((str(d), str(exc)))
            continue
        except Exception as exc:  # anything unexpected in one directory must not kill the report
            skipped.append((str(d), f"unreadable ({type(exc).__name__}: {exc})"))
            continue
        skipped += unreadable
        for score in scores:  # the final checkpoint's scores become columns of the run's row
            if score["step"] == row["last_step"]:
                row[score["column"]] = score["value"]
        evals += [{"run_dir": row["run_dir"], "final": s["step"] == row["last_step"], **s} for s in scores]
        rows.append(row)
        frames.append(m.assign(run_dir=row["run_dir"]))
    if not rows:
        return Collection(pd.DataFrame(), pd.DataFrame(), skipped)
    runs = pd.DataFrame(rows)
    runs["variant"] = _variants(runs)
    runs["algo_defaults"] = [_at_defaults(a, c) for a, c in zip(runs["algo"], runs["_config"])]
    configs = dict(zip(runs["run_dir"], runs["_config"]))
    runs = runs.drop(columns="_config")
    runs = runs.sort_values(["task", "algo", "variant", "seed", "run_dir"]).reset_index(drop=True)
    ident = ["run_dir", "algo", "task", "seed", "variant", "warm_start"]
    metrics = pd.concat(frames, ignore_index=True).merge(runs[ident], on="run_dir", how="left")
    metrics = metrics[ident[1:] + ["run_dir"] + [c for c in metrics.columns if c not in ident]]
    evals_frame = pd.DataFrame(evals)
    if not evals_frame.empty:
        evals_frame = runs[ident].merge(evals_frame, on="run_dir").sort_values(["task", "algo", "seed", "step", "column"])
    return Collection(runs, metrics, skipped, evals_frame.reset_index(drop=True), configs)
