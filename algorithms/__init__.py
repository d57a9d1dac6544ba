"""Registry of RL algorithms.

    @register_algorithm("grpo")
    class GRPO(Algorithm):
        config_class = GRPOConfig   # dataclass with the paper's defaults
        ...

Registering also stores the config in Hydra's ConfigStore group ``algo``, so
``algo=grpo algo.clip_high=0.28`` is type-checked when the config is composed.
Algorithms from other packages register the same way: import their module via
``plugins=[pkg.module]`` on the command line, or expose it through the entry-point
group ``harness.algorithms``.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from algorithms.base import AlgoConfig, Algorithm, Batch, MicroBatch, Needs

__all__ = [
    "AlgoConfig",
    "Algorithm",
    "Batch",
    "MicroBatch",
    "Needs",
    "available",
    "build",
    "get_class",
    "load_plugins",
    "register_algorithm",
    "summaries",
]

_REGISTRY: dict[str, type[Algorithm]] = {}
# Built-in algorithm modules; a missing one (not written yet) is skipped.
_BUILTIN_MODULES = (
    "algorithms.grpo",
    "algorithms.dr_grpo",
    "algorithms.ppo",
    "algorithms.dapo",
    "algorithms.remax",
    "algorithms.rloo",
    "algorithms.reinforce_pp",
    "algorithms.prime",
    "algorithms.gspo",
    "algorithms.cispo",
    "algorithms.gmpo",
    "algorithms.gpg",
    "algorithms.sapo",
    "algorithms.clip_cov",
    "algorithms.kl_cov",
    "algorithms.opd",
)
ENTRY_POINT_GROUP = "harness.algorithms"
DEFAULT = "grpo"  # what `harness run` trains when no algo= is given
_loaded = False


def register_algorithm(name: str, summary: str = "") -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator registering an ``Algorithm`` subclass under ``name``."""

    def wrap(cls: type[Algorithm]) -> type[Algorithm]:
        if name in _REGISTRY and _REGISTRY[name].__qualname__ != cls.__qualname__:
            raise ValueError(f"algorithm {name!r} is already registered by {_REGISTRY[name]!r}")
        if "update_aux" in vars(cls):  # the protocol before models were declared as roles
            raise TypeError(f"{cls.__name__}.update_aux is no longer called: declare the model as a Role in "
                            f"`needs` (trainable=True, loss=...) and the engine trains it after the policy")  # fmt: skip
        cls.name = name
        doc = (cls.__doc__ or "").strip()
        cls.summary = summary or (doc.splitlines()[0] if doc else "")
        _REGISTRY[name] = cls
        _store_config(name, cls.config_class)
        return cls

    return wrap


def _store_config(name: str, config_class: type[AlgoConfig]) -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="algo", name=name, node=config_class(name=name))


def load_plugins(modules: list[str] | tuple[str, ...] = ()) -> None:
    """Import built-ins, entry points (group ``harness.algorithms``) and ``modules``."""
    global _loaded
    if not _loaded:
        for mod in _BUILTIN_MODULES:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError as exc:
                if exc.name != mod:
                    raise
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            ep.load()
        _loaded = True
    for mod in modules:
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise ImportError(
                f"plugins: cannot import {mod!r} ({exc}); it must be an importable module "
                f"(on PYTHONPATH or installed) that calls @register_algorithm or @register_task"
            ) from exc


def available() -> list[str]:
    load_plugins()
    return sorted(_REGISTRY)


def did_you_mean(name: str) -> str:
    """' (did you mean 'grpo'?)' for a near miss among the registered algorithms, else ''."""
    close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def builtin() -> dict[str, type[Algorithm]]:
    """Every algorithm registered by a module of this package (not plugins), by name."""
    load_plugins()
    return {name: cls for name, cls in sorted(_REGISTRY.items()) if cls.__module__.startswith("algorithms.")}


def summaries() -> dict[str, str]:
    load_plugins()
    return {n: c.summary for n, c in sorted(_REGISTRY.items())}


def get_class(name: str) -> type[Algorithm]:
    load_plugins()
    if name not in _REGISTRY:
        raise KeyError(
            f"unknown algorithm {name!r}{did_you_mean(name)}; registered: {', '.join(sorted(_REGISTRY))}. "
            f"Register your own with @register_algorithm and load it with plugins=[your.module]"
        )
    return _REGISTRY[name]


def build(cfg) -> Algorithm:
    """Instantiate the algorithm named by ``cfg.name`` from a (DictConfig or dataclass) config."""
    from omegaconf import OmegaConf

    cls = get_class(cfg.name)
    if not isinstance(cfg, cls.config_class):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls.config_class), cfg))
    return cls(cfg)
