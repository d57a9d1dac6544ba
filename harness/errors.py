"""Errors every layer may raise (kept here, at the bottom, so no layer imports a higher one for them)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config value that cannot work; the message names the field and the fix."""
