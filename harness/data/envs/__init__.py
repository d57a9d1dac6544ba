"""Environments for multi-turn rollouts: a registry of plug-ins, like algorithms and tasks.

An environment turns an example into the first messages, reads each model turn and answers
with the next observation (a tool result, a user turn) or ends the episode::

    @register_env("my_env", summary="...")
    class MyEnv(Environment):
        def reset(self, example) -> list[dict]: ...          # the first chat messages
        def step(self, model_text: str) -> Turn: ...          # the observation, or done

A user's environment lives in their own package: ``plugins=[my_pkg.my_env]`` or an entry point
in the group ``harness.envs``. Built in: ``calculator`` (harness/data/envs/calculator_env.py).
The rollout loop that runs episodes (harness/runtime/driver/episodes.py) owns the token limits and
masks the environment's tokens out of the loss; an environment only sees text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.core.group import ConfigGroup
from harness.core.registry import Registry

if TYPE_CHECKING:
    from harness.data.tasks import Example

ENTRY_POINT_GROUP = "harness.envs"

# Why an episode ended (the rollout loop adds max_turns / max_tokens of its own limits).
END_REASONS = ("answered", "max_turns", "max_tokens", "truncated")


@dataclass
class EnvConfig(ConfigGroup):
    """Multi-turn episodes: the model and an environment take turns (docs/environments.md)."""

    name: str = ""  # a registered environment (calculator | a plugin's, see `harness list`); '' = one prompt, one response
    max_turns: int = 4  # model turns per episode
    # Tokens per model turn; 0 = what is left of rollout.max_response_tokens, which caps the whole
    # response span of an episode (the model's turns and the environment's observations).
    max_turn_tokens: int = 0
    demo_frac: float = 0.15  # model.path=tiny: fraction of warm-start examples taught as a worked episode (the rest answer directly)


@dataclass
class Turn:
    """What the environment answers to one model turn."""

    observation: str | None  # text the model sees next (a tool result); None when done
    done: bool
    end_reason: str = ""  # one of END_REASONS when done
    info: dict[str, Any] = field(default_factory=dict)  # counters for metrics, e.g. tool_calls, tool_errors


class Environment:
    """One episode at a time; a fresh instance per episode (``make_env(name, **settings)``)."""

    name = "?"

    def __init__(self, max_turns: int = 4, **settings: Any):
        self.max_turns = max_turns
        self.settings = settings

    def reset(self, example: Example) -> list[dict[str, str]]:
        raise NotImplementedError

    def step(self, model_text: str) -> Turn:
        raise NotImplementedError

    def final_answer(self, model_turns: list[str]) -> str:
        """The text the task's checker scores: by default the model's last turn."""
        return model_turns[-1] if model_turns else ""

    def demo(self, example: Example) -> list[str] | None:
        """A worked episode for ``example`` for a warm start to imitate: model turn, observation,
        model turn, ... ending with the model's answer; None if the environment has none."""
        return None


REGISTRY: Registry[type[Environment]] = Registry(
    "environment", builtin_modules=("harness.data.envs.calculator_env",), entry_point_group=ENTRY_POINT_GROUP,
    setting="env.name", how_to_add="Register your own with @register_env and load it with plugins=[your.module]",
)


def register_env(name: str, *, summary: str):
    """Class decorator: register an ``Environment`` subclass as ``env=NAME``."""

    def wrap(cls: type[Environment]) -> type[Environment]:
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise TypeError(f"@register_env({name!r}) needs a subclass of harness.envs.Environment, got {cls!r}")
        REGISTRY.add(name, cls)
        cls.name, cls.summary = name, summary
        return cls

    return wrap


def available() -> list[str]:
    return REGISTRY.names()


def summary(name: str) -> str:
    return REGISTRY.get(name).summary


def make_env(name: str, **settings: Any) -> Environment:
    """A fresh instance of environment ``name`` (one per episode)."""
    return REGISTRY.get(name)(**settings)
