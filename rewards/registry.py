"""Checker registry and the Verdict/Checker contract."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.core.registry import Registry


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


_INSTANCES: dict[str, Checker] = {}
REGISTRY: Registry[type[Checker]] = Registry(
    "checker", builtin_modules=("rewards.arith", "rewards.gsm8k", "rewards.math"), entry_point_group="harness.rewards",
    setting="task.checker", how_to_add="Register your own with @register_checker and load it with plugins=[your.module]",
)


def register_checker(name: str, version: str, summary: str = "") -> Callable[[type], type]:
    """Class decorator: ``@register_checker("gsm8k", version="1")``."""

    def wrap(cls: type[Checker]) -> type[Checker]:
        REGISTRY.add(name, cls)
        cls.name, cls.version = name, str(version)
        doc = (cls.__doc__ or "").strip()
        cls.summary = summary or (doc.splitlines()[0] if doc else "")
        return cls

    return wrap


def available() -> list[str]:
    return REGISTRY.names()


def summaries() -> dict[str, str]:
    """name@version -> one-line summary, for ``harness list``."""
    return {f"{n}@{c.version}": c.summary for n, c in REGISTRY.entries().items()}


def get(name: str) -> Checker:
    """The (shared) checker instance registered under ``name``."""
    if name not in _INSTANCES:
        _INSTANCES[name] = REGISTRY.get(name)()
    return _INSTANCES[name]
