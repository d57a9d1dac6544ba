"""``harness eval SWEEP_DIR``: score every run of a sweep after training, resumably.

    harness eval results/sweeps/quick --protocols greedy,maj@8 task.eval_prompts=1000
    harness eval results/sweeps/reasoning --checkpoints all --protocols greedy,pass@8

(arith's test split is its first task.eval_prompts problems; a file task's is its test file,
eval_limit=N keeps the first N.)

Each run directory below SWEEP_DIR (any depth: a suite's member sweeps too) has its final
checkpoint, or every checkpoint, scored with ``harness eval`` (harness/commands/evaluate.py: the run's
task and generation settings, the command line's KEY=VALUE overrides) once per sample count the
protocols need: ``greedy`` is one greedy sample per prompt; ``mean@K``, ``pass@K`` and ``maj@K``
share one evaluation with K samples per prompt at ``rollout.temperature`` (the run's, unless set).
Results land in RUN/evals/<step_N>/samples=K,T=t,<overrides>/ (harness.rundir.schema.EVALS_DIR), each an
eval run directory whose run.json names the protocols asked; `harness report` shows the final
checkpoint's scores as extra columns labelled with protocol, prompts and temperature.

Resumable: an evaluation whose run.json says finished is skipped, so an interrupted command is
rerun as it was typed. One failing evaluation (a corrupt checkpoint) is reported and the rest go on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from harness.commands.evaluate import EvalSource, evaluate_model
from harness.core.errors import ConfigError, HarnessError
from harness.core.registry import import_plugins
from harness.rundir.schema import EVALS_DIR, eval_dir_name, protocol_samples

NOT_WALKED = {".hydra", "checkpoints", EVALS_DIR, "report", "__pycache__", ".git"}


@dataclass(frozen=True)
class EvalJob:
    run_dir: Path  # the training run
    checkpoint: Path  # its checkpoints/step_N
    samples: int  # per prompt
    protocols: tuple[str, ...]  # what the report shows of this evaluation (greedy, maj@8, ...)
    out: Path  # RUN/evals/step_N/<setting>/

    def done(self) -> bool:
        import json

        try:
            return json.loads((self.out / "run.json").read_text()).get("status") == "finished"
        except (OSError, ValueError):
            return False


def is_sweep_dir(path: str | Path) -> bool:
    """A folder holding training run directories below it, and none itself (no checkpoints/, no config.json)."""
    p = Path(path)
    return p.is_dir() and not (p / "checkpoints").is_dir() and not (p / "config.json").exists() and bool(run_dirs(p))


def run_dirs(root: Path) -> list[Path]:
    """Every training run directory below ``root`` (config.yaml + checkpoints/), sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in NOT_WALKED)
        if "config.yaml" in filenames and os.path.isdir(os.path.join(dirpath, "checkpoints")):
            found.append(Path(dirpath))
    return sorted(found)


def parse_protocols(spec: str) -> dict[int, tuple[str, ...]]:
    """'greedy,maj@8,pass@8' -> {1: ('greedy',), 8: ('maj@8', 'pass@8')}: one evaluation per sample count."""
    by_samples: dict[int, list[str]] = {}
    for name in (s.strip() for s in spec.split(",")):
        if not name:
            continue
        try:
            k = protocol_samples(name)
        except ValueError as exc:
            raise ConfigError(f"--protocols: {exc}") from None
        by_samples.setdefault(k, []).append("greedy" if k == 1 else name)
    if not by_samples:
        raise ConfigError("--protocols: name at least one of greedy, mean@K, pass@K, maj@K")
    return {k: tuple(dict.fromkeys(v)) for k, v in sorted(by_samples.items())}


def _override(overrides: list[str], key: str) -> str | None:
    values = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key]
    return values[-1] if values else None


def plan(sweep_dir: Path, protocols: dict[int, tuple[str, ...]], checkpoints: str, overrides: list[str]) -> list[EvalJob]:
    """The evaluations to run (finished ones included: EvalJob.done)."""
    jobs = []
    for run in run_dirs(sweep_dir):
        steps = sorted(c for c in (run / "checkpoints").glob("step_*") if (c / "policy" / "config.json").exists())
        if not steps:
            continue
        temperature = _override(overrides, "rollout.temperature")
        if temperature is None:
            cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
            temperature = (cfg.get("rollout") or {}).get("temperature", 1.0)
        for step in steps if checkpoints == "all" else steps[-1:]:
            for k, names in protocols.items():
                out = run / EVALS_DIR / step.name / eval_dir_name(k, float(temperature), overrides)
                jobs.append(EvalJob(run, step, k, names, out))
    return jobs


def evaluate_sweep(sweep_dir: str | Path, protocols: str = "greedy", checkpoints: str = "final",
                   overrides: list[str] | None = None, console: Console | None = None) -> int:
    """Run every pending evaluation of ``sweep_dir``; returns the exit status (0: all finished)."""
    from harness.config import compose_config

    console = console or Console()
    overrides = list(overrides or [])
    if checkpoints not in ("final", "all"):
        raise ConfigError(f"--checkpoints {checkpoints}: use final (each run's last checkpoint) or all")
    for o in overrides:
        if o.split("=", 1)[0] in ("samples", "model.path", "run_dir"):
            raise ConfigError(f"{o}: harness eval SWEEP_DIR sets {o.split('=', 1)[0]} itself (samples: from --protocols)")
    jobs = plan(Path(sweep_dir), parse_protocols(protocols), checkpoints, overrides)
    if not jobs:
        raise ConfigError(f"{sweep_dir}: no run directory with a checkpoint below it")
    pending = [j for j in jobs if not j.done()]
    console.print(f"harness eval {sweep_dir}: {len(jobs)} evaluation(s) of {len({j.run_dir for j in jobs})} run(s), "
                  f"{len(jobs) - len(pending)} already finished (skipped), {len(pending)} to run", highlight=False)
    failed: list[tuple[EvalJob, str]] = []
    for i, job in enumerate(pending, 1):
        name = f"{job.run_dir.relative_to(sweep_dir)}/{job.checkpoint.name} {job.out.name} ({', '.join(job.protocols)})"
        console.print(f"[bold][{i}/{len(pending)}][/] {name}", highlight=False)
        try:
            cfg = _config(job, overrides, compose_config)
            import_plugins(list(cfg.plugins))
            evaluate_model(cfg, str(job.out), console, protocols=list(job.protocols))
        except HarnessError as exc:
            failed.append((job, str(exc)))
            console.print(f"[red]failed[/] {name}: {exc}", highlight=False)
        except Exception as exc:  # one unreadable checkpoint must not stop the others
            failed.append((job, f"{type(exc).__name__}: {exc}"))
            console.print(f"[red]failed[/] {name}: {type(exc).__name__}: {exc}", highlight=False)
    done = len(jobs) - len(failed)
    console.print(f"{done}/{len(jobs)} evaluation(s) finished; results in <run>/{EVALS_DIR}/; "
                  f"`harness report {sweep_dir}` shows them", highlight=False)
    for job, why in failed:
        console.print(f"  [red]failed:[/] {job.out}: {why} (rerun the same command to retry)", highlight=False)
    return 1 if failed else 0


def _config(job: EvalJob, overrides: list[str], compose_config: Any) -> Any:
    """The eval config of one job: the command line's overrides, the run's inherited settings."""
    from omegaconf import open_dict

    given = [*overrides, f"samples={job.samples}"]
    cfg = compose_config(given)
    with open_dict(cfg):
        cfg.run_dir = str(job.out)
    source = EvalSource(job.checkpoint / "policy", job.run_dir / "config.yaml", str(job.out))
    return source.apply(cfg, given)
