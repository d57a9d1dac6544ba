"""Errors every layer may raise (kept here, at the bottom, so no layer imports a higher one for them).

Each is an expected failure whose message names the cause and the fix: the command line
prints it as one line, without a traceback, and exits non-zero.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base of the one-line failures."""


class ConfigError(HarnessError, ValueError):
    """A config value that cannot work; the message names the field and the fix."""


class DataError(HarnessError, ValueError):
    """A data file or source that cannot be used; the message says which and why."""


class ModelError(HarnessError, ValueError):
    """A model directory that cannot be used (the message names the path and the fix)."""


class RunDirBusy(HarnessError):
    """Another live process writes this run directory."""


class CheckpointError(HarnessError):
    """A checkpoint could not be written (the previous one is intact) or none could be read."""


class TrainingDiverged(HarnessError):
    """Non-finite gradients, weights or rewards: the run stopped before it could spoil a checkpoint."""
