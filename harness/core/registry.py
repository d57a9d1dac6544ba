"""The one registry every kind of plug-in uses: algorithms, reward checkers, tasks, environments,
rollout backends and off-policy corrections.

A registry maps names to what a decorator registered under them. It fills itself on first use from
three places, in this order: the built-in modules (imported by name, so a registry never imports its
own plug-ins at module level), the entry points of its group (an installed package's plug-ins), and
whatever a run's ``plugins=[...]`` imported (``import_plugins``). A name has one owner: the same
object registered again (a module imported twice) is accepted, another one is refused, so a plugin
cannot silently replace a built-in. An unknown name is a ``KeyError`` that names the nearest
registered one and the way to add your own.

This module imports nothing of the harness: algorithms/ and rewards/ use it too (pyproject's
import contracts allow exactly this module).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


def _where(obj: object) -> tuple[str, str]:
    """A registered object's module and qualified name (the same when its module is imported twice)."""
    return getattr(obj, "__module__", "?"), getattr(obj, "__qualname__", repr(obj))


class Registry(Generic[T]):
    """Names -> registered entries of one kind (a class, a function, or a spec that holds one)."""

    def __init__(self, kind: str, *, builtin_modules: tuple[str, ...] = (), entry_point_group: str = "",
                 setting: str = "", how_to_add: str = "", owner: Callable[[T], object] = lambda entry: entry,
                 optional_builtins: bool = False) -> None:  # fmt: skip
        self.kind = kind  # 'algorithm', 'checker', ... : the word an error message uses
        self.builtin_modules = builtin_modules
        self.entry_point_group = entry_point_group
        self.setting = setting  # the config field that names an entry (rollout.backend), for errors
        self.how_to_add = how_to_add  # one sentence: the decorator and plugins=[...]
        self.owner = owner  # the class or function an entry registers (a spec holds one)
        self.optional_builtins = optional_builtins  # a built-in module not written yet is skipped (algorithms)
        self._entries: dict[str, T] = {}
        self._loaded = self._loading = False

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name``; a name already owned by another module's object is refused."""
        old = self._entries.get(name)
        if old is not None and old is not entry and _where(self.owner(old)) != _where(self.owner(entry)):
            module, qualname = _where(self.owner(old))
            raise ValueError(f"{self.kind} {name!r} is already registered by {module}.{qualname}")
        self._entries[name] = entry
        return entry

    def load(self) -> None:
        """Import the built-in modules and the entry points of the group, once (again after a failure)."""
        if self._loaded or self._loading:
            return  # loading: a built-in module asks its own registry while it is imported
        self._loading = True
        try:
            for module in self.builtin_modules:
                try:
                    importlib.import_module(module)
                except ModuleNotFoundError as exc:
                    if not self.optional_builtins or exc.name != module:  # a missing dependency inside: always raised
                        raise
            if self.entry_point_group:
                for ep in entry_points(group=self.entry_point_group):
                    ep.load()
            self._loaded = True
        finally:
            self._loading = False

    def entries(self) -> dict[str, T]:
        """Every registered entry, by name, sorted."""
        self.load()
        return dict(sorted(self._entries.items()))

    def names(self) -> list[str]:
        return list(self.entries())

    def __contains__(self, name: object) -> bool:
        self.load()
        return name in self._entries

    def did_you_mean(self, name: str) -> str:
        """' (did you mean 'grpo'?)' for a near miss, else ''."""
        close = difflib.get_close_matches(name, list(self._entries), n=1)
        return f" (did you mean {close[0]!r}?)" if close else ""

    def get(self, name: str, error: type[Exception] = KeyError) -> T:
        """The entry registered as ``name``; else ``error`` (a KeyError, or the caller's kind: ConfigError,
        DataError) naming the nearest one and the registered ones."""
        self.load()
        if name not in self._entries:
            what = f"{self.setting}={name!r}" if self.setting else f"{self.kind} {name!r}"
            add = f". {self.how_to_add}" if self.how_to_add else ""
            raise error(f"{what} is unknown{self.did_you_mean(name)}; registered: "
                        f"{', '.join(sorted(self._entries))}{add}")  # fmt: skip
        return self._entries[name]


def import_plugins(modules: list[str] | tuple[str, ...]) -> None:
    """Import a run's ``plugins=[...]``: each module registers what it defines (an algorithm, a task,
    a checker, a backend, an environment, a correction) with the registries' decorators."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(
                f"plugins: cannot import {module!r} ({exc}); it must be an importable module (on PYTHONPATH or "
                f"installed) that registers its plug-ins (@register_algorithm, @register_task, @register_checker, "
                f"@register_backend, @register_env, @register_correction)"
            ) from exc
