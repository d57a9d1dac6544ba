"""The base of every config group: one dataclass is both the Hydra schema and what its reader takes.

Hydra fills a group's node from the YAML, the presets and the command line; ``harness.config``
turns each node into an instance once, and the parts below the config read that instance. An
instance is read-only: a field set twice raises, so no part changes what another reads. (Not a
frozen dataclass: OmegaConf would make the Hydra node read-only too, and refuse overrides.)
"""

from __future__ import annotations

from typing import Any


class ConfigGroup:
    """Mix-in for a ``@dataclass`` config group: its instances refuse assignment after ``__init__``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__:  # __init__ sets each field once; a second set is a change
            raise AttributeError(f"{type(self).__name__}.{name} is read-only once built: set it in the config "
                                 f"(a Hydra override) or build a new one with dataclasses.replace")
        object.__setattr__(self, name, value)
