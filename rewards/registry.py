"""Checker registry and the Verdict/Checker contract."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """Outcome of checking one response against one ground truth."""

    score: float  # reward handed to the RL algorithm
    correct: bool  # True when the extracted answer equals the ground truth
    extracted: str | None  # the answer found in the response (None: nothing found)
    reason: str  # short machine-readable why, e.g. "match", "no_answer", "mismatch"

    @property
    def outcome(self) -> str:
        """The reason in five kinds: correct | wrong | no_answer (nothing usable found: no answer,
        no number, a hedge between answers) | timeout | error (the checker failed, a bad ground truth)."""
        if self.correct:
            return "correct"
        kind = self.reason.split(":", 1)[0]
        if kind in ("no_answer", "no_number", "hedged"):
            return "no_answer"
        if kind == "timeout":
            return "timeout"
        if kind in ("error", "bad_ground_truth"):
            return "error"
        return "wrong"


class Checker:
    """Base class. Subclasses implement ``_score``; ``score`` never raises."""

    name: str = ""
    version: str = ""
    summary: str = ""

    def _score(self, response: str, ground_truth: str) -> Verdict:  # pragma: no cover
        raise NotImplementedError

    def score(self, response: str, ground_truth: str) -> Verdict:
        try:
            return self._score(response, ground_truth)
        except Exception as exc:  # malformed input must never reach the trainer
            return Verdict(0.0, False, None, f"error:{type(exc).__name__}")

    def score_batch(self, responses: Sequence[str], ground_truths: Sequence[str]) -> list[Verdict]:
        if len(responses) != len(ground_truths):
            raise ValueError(
                f"score_batch got {len(responses)} responses but {len(ground_truths)} ground truths"
            )
        return [self.score(r, g) for r, g in zip(responses, ground_truths)]

    @property
    def tag(self) -> str:
        """``name@version``: what run.json and the tables record."""
        return f"{self.name}@{self.version}"


_REGISTRY: dict[str, type[Checker]] = {}
_INSTANCES: dict[str, Checker] = {}
# Built-in checkers live in these modules; importing them registers them.
_BUILTIN_MODULES = ("rewards.arith", "rewards.gsm8k", "rewards.math")


def register_checker(name: str, version: str, summary: str = "") -> Callable[[type], type]:
    """Class decorator: ``@register_checker("gsm8k", version="1")``."""

    def wrap(cls: type[Checker]) -> type[Checker]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"checker {name!r} is already registered by {_REGISTRY[name]!r}")
        cls.name, cls.version = name, str(version)
        doc = (cls.__doc__ or "").strip()
        cls.summary = summary or (doc.splitlines()[0] if doc else "")
        _REGISTRY[name] = cls
        return cls

    return wrap


def _load_builtins() -> None:
    for mod in _BUILTIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:  # a real missing dependency inside the module
                raise


def available() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def summaries() -> dict[str, str]:
    """name@version -> one-line summary, for ``harness list``."""
    _load_builtins()
    return {f"{n}@{c.version}": c.summary for n, c in sorted(_REGISTRY.items())}


def get(name: str) -> Checker:
    """The (shared) checker instance registered under ``name``."""
    _load_builtins()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KeyError(f"unknown checker {name!r}{hint}; registered: {', '.join(sorted(_REGISTRY))}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]
