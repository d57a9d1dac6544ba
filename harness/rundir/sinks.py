"""Where metrics go besides metrics.jsonl: TensorBoard, Weights & Biases, MLflow (``logging.sinks``).

metrics.jsonl is always written and stays the source of truth (``harness report`` reads only
it); every other sink gets the same lines under the same names with step = RL step, plus the
resolved config and run.json's provenance as run metadata. Each tracker is an optional extra,
imported only when chosen (``pip install 'harness[trackers]'``). A sink that fails -- not
installed, no network, a bad key, a full quota -- is reported once and switched off: it never
stops or slows the run.

W&B: project ``logging.wandb_project``, run name = the run directory's name, group = the
directory holding it (a sweep's folder: a sweep appears grouped), job type = the algorithm,
id derived from the run directory (a resumed run continues the same W&B run). Offline with
``WANDB_MODE=offline`` (files under the run directory's ``wandb/``). TensorBoard: event files
in ``<run_dir>/tensorboard``. MLflow: ``logging.mlflow_tracking_uri`` (default: ``file:`` store
``<run_dir>/mlruns``), experiment = the group.
"""

from __future__ import annotations

import hashlib
import json
import logging
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.group import ConfigGroup
from harness.rundir.schema import flatten

log = logging.getLogger(__name__)
SINKS = ("jsonl", "tensorboard", "wandb", "mlflow")


@dataclass
class LoggingConfig(ConfigGroup):
    """``logging.*`` (read here, and by the trainer: kl_from_start)."""

    # Where metrics go besides metrics.jsonl (always written): tensorboard | wandb | mlflow (the
    # trackers extra); each gets every metrics line, step = RL step.
    sinks: list[str] = field(default_factory=lambda: ["jsonl"])
    wandb_project: str = "harness"
    wandb_entity: str = ""  # '' = your default entity
    mlflow_tracking_uri: str = ""  # '' = a file store in <run_dir>/mlruns
    # Log kl/from_start (KL(policy || start) per sequence, the sampled estimate) every step; an
    # algorithm without a reference model gets the frozen start as one (a forward pass more per step).
    kl_from_start: bool = False


def scalars(metrics: dict[str, object]) -> dict[str, float]:
    """The numeric entries of a metrics line (``step`` excluded: it is the x axis)."""
    return {k: float(v) for k, v in metrics.items()
            if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool)}  # fmt: skip


class TensorBoardSink:
    def __init__(self, run_dir: Path, config: dict, info: dict):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```")
        self.writer.add_text("run", "```\n" + json.dumps(info, indent=2, default=str) + "\n```")

    def log(self, metrics: dict[str, object], step: int) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self, info: dict) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, run_dir: Path, config: dict, info: dict, project: str, entity: str):
        import wandb

        run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(
            project=project, entity=entity or None, dir=str(run_dir), name=run_dir.name, id=run_id, resume="allow",
            group=run_dir.resolve().parent.name, job_type=str(info.get("algo", "")), config=config,
            settings=wandb.Settings(console="off", silent=True),
        )  # fmt: skip
        self.run.summary.update({"provenance": {k: info.get(k) for k in ("git", "versions", "host", "model_info")}})

    def log(self, metrics: dict[str, object], step: int) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self, info: dict) -> None:
        self.run.summary.update({k: v for k, v in info.items() if isinstance(v, (int, float, str))})
        self.run.finish()


class MLflowSink:
    def __init__(self, run_dir: Path, config: dict, info: dict, tracking_uri: str):
        import mlflow

        self.mlflow = mlflow
        if not tracking_uri:  # a file store beside the run (MLflow 3 asks for an explicit opt-in to it)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            tracking_uri = (run_dir / "mlruns").resolve().as_uri()
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(run_dir.resolve().parent.name)
        self.run = mlflow.start_run(run_name=run_dir.name, tags={"algo": str(info.get("algo", ""))})
        params = {k: str(v)[:500] for k, v in flatten(config).items()}  # MLflow caps a value at 500 chars
        for start in range(0, len(params), 100):  # and a call at 100 params
            mlflow.log_params(dict(list(params.items())[start : start + 100]))
        mlflow.log_dict(info, "run.json")

    def log(self, metrics: dict[str, object], step: int) -> None:
        self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in scalars(metrics).items()}, step=step)

    def close(self, info: dict) -> None:
        self.mlflow.log_dict(info, "run_final.json")
        self.mlflow.end_run()


class Sinks:
    """The chosen trackers; each call is guarded, a failing sink is dropped after one warning."""

    def __init__(self, logging_cfg: LoggingConfig, run_dir: Path, config: dict, info: dict):
        self.active: dict[str, TensorBoardSink | WandbSink | MLflowSink] = {}
        for name in logging_cfg.sinks:
            if name == "jsonl":  # written by RunDir.log, always
                continue
            build = {
                "tensorboard": lambda: TensorBoardSink(run_dir, config, info),
                "wandb": lambda: WandbSink(run_dir, config, info, logging_cfg.wandb_project, logging_cfg.wandb_entity),
                "mlflow": lambda: MLflowSink(run_dir, config, info, logging_cfg.mlflow_tracking_uri),
            }[name]
            try:
                self.active[name] = build()
            except Exception as exc:  # ImportError (extra not installed), network, credentials, ...
                self._drop(name, "start", exc, installed=not isinstance(exc, ImportError))

    def _drop(self, name: str, what: str, exc: Exception, installed: bool = True) -> None:
        self.active.pop(name, None)
        hint = "" if installed else " (pip install 'harness[trackers]')"
        log.warning("logging sink %s failed at %s (%s: %s)%s; it is off for the rest of this run, metrics.jsonl "
                    "has everything", name, what, type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "",
                    hint)  # fmt: skip

    def log(self, metrics: dict[str, object]) -> None:
        for name, sink in list(self.active.items()):
            try:
                sink.log(metrics, int(metrics.get("step", 0)))
            except Exception as exc:
                self._drop(name, f"step {metrics.get('step')}", exc)

    def close(self, info: dict) -> None:
        for name, sink in list(self.active.items()):
            try:
                sink.close(info)
            except Exception as exc:
                self._drop(name, "close", exc)
        self.active = {}
