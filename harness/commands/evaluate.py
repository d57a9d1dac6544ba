"""``harness eval``: score a model on a task's test split, written as a run directory.

    harness eval model.path=Qwen/Qwen2.5-0.5B-Instruct task=math500 samples=8
    harness eval model.path=results/runs/X/checkpoints/step_0000150/policy   # a trained policy
    harness eval results/sweeps/quick/algo=grpo,seed=0               # a run's last checkpoint, its task
    harness eval results/runs/X --checkpoint step_0000150 samples=8  # another checkpoint

One generate-and-score path (harness/scoring.py) serves this command and the
in-training eval (harness/trainer.py): both render, generate through the
HybridEngine (so ``rollout=vllm`` and ``runtime.workers`` apply here too) in chunks of
``rollout.eval_batch_prompts`` prompts, and score with the task's checker, so evaluating
a checkpoint's policy directory reproduces the eval logged at that step exactly -- for
checkpoints taken at an eval step (the last one always is), with the same rollout backend,
precision, ``runtime.workers`` and ``rollout.eval_batch_prompts``.

Samples ``samples`` responses per prompt (greedy when samples == 1), scores them with
the task's checker, and reports accuracy (mean@k: the mean correctness over all samples), the
unbiased pass@k (Chen et al. 2021) for k = 1, 2, 4, ... <= samples, maj@k (majority vote over
the extracted answers) when samples > 1, each with a 95% interval over prompts (Wilson for
0/1 scores, a seeded bootstrap otherwise), and for MATH the same per subject and per level.
run.json names the protocol (greedy@1 or mean@K T=...), the number of prompts and the temperature. The run directory holds config.yaml, run.json,
metrics.jsonl (one line, step 0) and samples.jsonl (every response with its verdict);
`harness report` lists it as an eval run, not a training run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress

import rewards
from algorithms import Needs
from harness.config import Config, runtime_settings, validate
from harness.core.errors import ConfigError
from harness.data.tasks import check_prompts, load_task
from harness.models import load_tokenizer, resolve_model
from harness.rundir.schema import RENAMED_KEYS, protocol_kind, protocol_scores
from harness.rundir.writer import RunDir
from harness.runtime.driver.hybrid_engine import HybridEngine
from harness.runtime.settings import BatchSizes
from harness.scoring import eval_settings, generate_and_score, outcome_metrics
from rewards.evaluate import pass_at_k

log = logging.getLogger("harness")

# What `harness eval RUN_DIR` takes from the run's config.yaml unless the command line sets it:
# the task and environment it trained on, its generation settings and numerics, so that the
# eval at a checkpoint that had one reproduces the logged accuracy.
INHERITED = ("task", "env", "rollout", "model.dtype", "model.trust_remote_code", "trainer.precision", "plugins")
NOT_INHERITED = ("rollout.server.",)  # a run's rollout server is gone by the time its policy is scored


@dataclass
class EvalSource:
    """A path given to `harness eval` without Hydra's override grammar (a sweep's run dirs are
    named ``algo=grpo,seed=0``, which no override can spell): a run directory (its newest
    checkpoint, or ``checkpoint``), a checkpoint's ``policy/`` directory, or any model directory."""

    model_dir: Path  # the Hugging Face directory scored
    run_config: Path | None  # the config.yaml of the run that trained it, if there is one
    label: str  # where results go below results/evals/

    @classmethod
    def resolve(cls, path: str, checkpoint: str | None = None) -> EvalSource:
        p = Path(path)
        if (p / "checkpoints").is_dir():  # a run directory
            steps = sorted(c for c in (p / "checkpoints").glob("step_*") if (c / "policy" / "config.json").exists())
            if not steps:
                raise ConfigError(f"{p}: no checkpoint with a policy/ directory under {p / 'checkpoints'} (was the run "
                                  f"started? trainer.checkpoint_every=0 still checkpoints at the end)")  # fmt: skip
            if checkpoint:
                wanted = _step_number(checkpoint)
                chosen = [c for c in steps if _step_number(c.name) == wanted]
                if not chosen:
                    raise ConfigError(f"--checkpoint {checkpoint}: not in {p / 'checkpoints'}; there: "
                                      f"{', '.join(c.name for c in steps)}")  # fmt: skip
                step = chosen[0]
            else:
                step = steps[-1]
            config = p / "config.yaml"
            return cls(step / "policy", config if config.exists() else None, f"{p.parent.name}/{p.name}/{step.name}")
        if checkpoint:
            raise ConfigError(f"--checkpoint {checkpoint} needs a run directory (with checkpoints/); {p} is not one")
        if (p / "config.json").exists():  # a model directory, maybe <run>/checkpoints/step_N/policy
            run = p.parent.parent.parent
            config = run / "config.yaml" if p.name == "policy" and p.parent.parent.name == "checkpoints" else None
            if config is not None and config.exists():
                return cls(p, config, f"{run.parent.name}/{run.name}/{p.parent.name}")
            digest = hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:8]  # /a/policy and /b/policy apart
            return cls(p, None, f"{p.name}-{digest}")
        raise ConfigError(f"harness eval {path}: neither a run directory (with checkpoints/) nor a model directory "
                          f"(with config.json); for a hub id use model.path=ID")  # fmt: skip

    def apply(self, cfg: Config, overrides: list[str]) -> Config:
        """``cfg`` with model.path set to the scored directory and the run's INHERITED settings,
        except those the command line sets (a group override such as ``task=gsm8k`` naming
        another task keeps the whole group from the command line)."""
        from omegaconf import OmegaConf, open_dict

        given = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
        with open_dict(cfg):
            cfg.model.path = str(self.model_dir)
        if self.run_config is None:
            return cfg
        run = OmegaConf.load(self.run_config)
        for key in INHERITED:
            value = OmegaConf.select(run, key)
            if value is None:
                continue
            flat = _leaves(key, OmegaConf.to_container(value)) if OmegaConf.is_config(value) else {key: value}
            for leaf, v in flat.items():
                leaf = RENAMED_KEYS.get(leaf, leaf)  # a run written before a key moved
                if leaf.startswith(NOT_INHERITED) or _set_by_user(leaf, given):
                    continue
                if OmegaConf.select(cfg, leaf, default="__missing__") == "__missing__":
                    continue  # a field this version no longer has
                OmegaConf.update(cfg, leaf, v, merge=False)
        if OmegaConf.select(run, "model.path") == "tiny" and not _set_by_user("task.use_chat_template", given):
            cfg.task.use_chat_template = False  # a tiny tokenizer has no template: the same plain prompts, said so
        return cfg


def _step_number(name: str) -> int:
    m = re.fullmatch(r"(?:step_)?0*(\d+)", str(name))
    if not m:
        raise ConfigError(f"--checkpoint {name!r}: give step_N (as in checkpoints/) or N")
    return int(m.group(1))


def _leaves(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _leaves(f"{prefix}.{key}", sub).items()}
    return {prefix: value}


def _set_by_user(leaf: str, given: set[str]) -> bool:
    """True when the command line sets ``leaf`` or a section above it, or picks its group:
    ``task=NAME`` takes that task's preset whole; ``rollout=NAME`` sets only the backend."""
    parts = leaf.split(".")
    if any(".".join(parts[:i]) in given for i in range(2, len(parts) + 1)):
        return True
    if parts[0] in given:
        return parts[0] == "task" or leaf == "rollout.backend"
    return False


def _ks(samples: int) -> list[int]:
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 2
    return ks if ks[-1] == samples else ks + [samples]


CI_LEVEL = 0.95
CI_RESAMPLES = 2000  # the bootstrap's resamples (seed 0: the same interval on every machine)


def prompt_ci(values: list[float], level: float = CI_LEVEL) -> tuple[float, float]:
    """The ``level`` interval of a mean over prompts: Wilson's score interval when every value is 0 or 1
    (a proportion: greedy accuracy, maj@k), else a percentile bootstrap over prompts (mean@k, pass@k)."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    if np.isin(x, (0.0, 1.0)).all():
        from statsmodels.stats.proportion import proportion_confint

        low, high = proportion_confint(int(x.sum()), len(x), alpha=1 - level, method="wilson")
        return float(low), float(high)
    means = x[np.random.default_rng(0).integers(0, len(x), (CI_RESAMPLES, len(x)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def majority_correct(answers: list[str | None], correct: list[bool]) -> bool:
    """maj@n for one prompt (self-consistency, Wang et al. 2022): the most frequent extracted answer wins
    (a tie: the one sampled first), and is right when any of its samples was verified right (one
    sample's check may have timed out); no answer extracted: wrong. Answers count as equal when their
    stripped strings are (so \\frac12 and 0.5 vote apart: maj@k is a lower bound on MATH)."""
    votes: dict[str, int] = {}
    verdict: dict[str, bool] = {}
    for answer, ok in zip(answers, correct):
        if answer is None or not str(answer).strip():
            continue
        key = str(answer).strip()
        votes[key] = votes.get(key, 0) + 1
        verdict[key] = verdict.get(key, False) or bool(ok)
    if not votes:
        return False
    return verdict[max(votes, key=votes.__getitem__)]  # max keeps the first of equal counts: sampled first


def summarise(correct: list[list[bool]], prefix: str, answers: list[list[str | None]] | None = None) -> dict[str, float]:
    """mean@n accuracy, unbiased pass@k and (given the extracted ``answers``) maj@n over prompts with n
    samples each; every score with its 95% interval over prompts (``<key>_ci_low``, ``<key>_ci_high``)."""
    n = len(correct[0]) if correct else 0
    out: dict[str, float] = {f"{prefix}/prompts": float(len(correct))}
    if not correct:
        return out
    per_prompt = {"accuracy": [sum(c) / n for c in correct]}
    for k in _ks(n):
        per_prompt[f"pass@{k}"] = [pass_at_k(n, sum(c), k) for c in correct]
    if answers is not None and n > 1:
        per_prompt[f"maj@{n}"] = [float(majority_correct(a, c)) for a, c in zip(answers, correct)]
    for name, values in per_prompt.items():
        out[f"{prefix}/{name}"] = sum(values) / len(values)
        out[f"{prefix}/{name}_ci_low"], out[f"{prefix}/{name}_ci_high"] = prompt_ci(values)
    return out


def protocol(samples: int, temperature: float) -> str:
    """The label of the accuracy an eval reports: greedy@1, or mean@K at temperature T."""
    return "greedy@1" if samples == 1 else f"mean@{samples} T={temperature:g}"


def evaluate_model(cfg: Config, run_dir: str, console: Console | None = None, protocols: list[str] | None = None) -> dict[str, Any]:
    """Score ``cfg.model.path`` into ``run_dir``; ``protocols`` (e.g. ["maj@8"]): the scores the report
    shows as columns (run.json ``protocols``), default every score of this setting (harness.rundir.schema.protocol_scores)."""
    console = console or Console()
    sizes = validate(cfg)
    if cfg.runtime.threads > 0:
        torch.set_num_threads(cfg.runtime.threads)
    with RunDir(run_dir, cfg) as run:  # locked: a second writer is refused
        return _evaluate(cfg, sizes, run, console, protocols)


def _evaluate(cfg: Config, sizes: BatchSizes, run: RunDir, console: Console, protocols: list[str] | None) -> dict[str, Any]:
    checker = rewards.get(cfg.task.checker)
    task = load_task(cfg.task)
    examples = task.test[: cfg.eval_limit] if cfg.eval_limit else task.test
    if cfg.eval_limit > len(task.test):
        log.warning("eval_limit=%d, but task %s's test split holds %d prompts: all %d are scored (a generated task "
                    "such as arith makes task.eval_prompts test problems: set task.eval_prompts=N)", cfg.eval_limit,
                    task.name, len(task.test), len(task.test))  # fmt: skip
    model_path, model_info = resolve_model(cfg.model, task, checker, cfg.rollout.max_response_tokens, console, cfg.env)
    tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
    check_prompts(task, tokenizer, examples, expect_template=cfg.model.path != "tiny")
    run.start(cfg, checker.tag, model_info)
    run.write_info(kind="eval", model_path=model_path)
    torch.manual_seed(cfg.seed)
    samples = int(cfg.samples)
    temperature = cfg.rollout.temperature if samples > 1 else 0.0
    # Generation only: the workers build their rollout engines and no training model.
    engine = HybridEngine(runtime_settings(cfg), Needs(old_logp=False), model_path, sizes, rollout_only=True,
                          tokenizer=tokenizer)
    t0 = time.perf_counter()
    try:
        with Progress(console=console, transient=True) as progress:
            scored = generate_and_score(engine, examples, checker, samples, temperature, progress=progress,
                                        **eval_settings(cfg.rollout))  # fmt: skip
    finally:
        engine.close()
    correct: list[list[bool]] = []
    answers: list[list[str | None]] = []  # the checker's extracted answers (maj@k)
    tokens = 0
    index = 0
    with (run.path / "samples.jsonl").open("w") as out:
        for batch, verdicts in scored:
            tokens += int(batch.response_mask.sum())
            for g in range(int(batch.group_ids.max()) + 1 if len(batch) else 0):
                rows = (batch.group_ids == g).nonzero().flatten().tolist()
                ex = examples[index]
                correct.append([bool(batch.correct[i]) for i in rows])
                answers.append([verdicts[i].extracted for i in rows])
                for i in rows:
                    v = verdicts[i]
                    out.write(json.dumps({"index": index, "response": batch.responses[i], "ground_truth": ex.ground_truth,
                                          **ex.meta, "correct": v.correct, "extracted": v.extracted,
                                          "reason": v.reason}) + "\n")
                index += 1
    prefix = f"eval/{task.name}"
    metrics = {"step": 0, **summarise(correct, prefix, answers), **outcome_metrics([v for _, vs in scored for v in vs], prefix)}
    for field in ("subject", "level"):  # MATH breakdowns
        groups: dict[str, list[list[bool]]] = defaultdict(list)
        group_answers: dict[str, list[list[str | None]]] = defaultdict(list)
        for ex, c, a in zip(examples, correct, answers):
            if ex.meta.get(field):
                groups[str(ex.meta[field])].append(c)
                group_answers[str(ex.meta[field])].append(a)
        for value, rows in sorted(groups.items()):
            metrics |= summarise(rows, f"{prefix}/{field}={value}", group_answers[value])
    run.truncate_metrics(-1)
    run.log(metrics)
    wall = time.perf_counter() - t0
    acc = metrics.get(f"{prefix}/accuracy", float("nan"))
    label = protocol(samples, temperature)
    scores = protocol_scores(samples, temperature)
    wanted = {protocol_kind(p) for p in protocols} if protocols else None
    run.write_info(status="finished", wall_s=round(wall, 2), generated_tokens=tokens, eval_first=acc,
                   eval_final=acc, eval_best=acc, eval_metric=f"{prefix}/accuracy", samples=samples,
                   protocol=label, eval_prompts=len(examples), temperature=temperature,
                   protocols=[p for p in scores if wanted is None or protocol_kind(p) in wanted])  # fmt: skip
    low, high = metrics.get(f"{prefix}/accuracy_ci_low", acc), metrics.get(f"{prefix}/accuracy_ci_high", acc)
    majority = f", maj@{samples} {metrics[f'{prefix}/maj@{samples}']:.4f}" if f"{prefix}/maj@{samples}" in metrics else ""
    console.print(
        f"[bold green]eval[/] {task.name}: accuracy ({label}) {acc:.4f} [95% CI {low:.4f}-{high:.4f}], "
        + ", ".join(f"pass@{k} {metrics[f'{prefix}/pass@{k}']:.4f}" for k in _ks(samples)) + majority
        + f" on {len(examples)} prompts; checker {checker.tag}; results in {run.path}"
    )
    return metrics
