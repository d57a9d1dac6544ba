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

from collections.abc import Callable

from algorithms.base import AlgoConfig, Algorithm, Batch, MicroBatch, Needs
from harness.core.registry import Registry, import_plugins

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
REGISTRY: Registry[type[Algorithm]] = Registry(
    "algorithm", builtin_modules=_BUILTIN_MODULES, entry_point_group=ENTRY_POINT_GROUP, setting="algo", optional_builtins=True,
    how_to_add="Register your own with @register_algorithm and load it with plugins=[your.module]",
)


def register_algorithm(name: str, summary: str = "") -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator registering an ``Algorithm`` subclass under ``name``."""

    def wrap(cls: type[Algorithm]) -> type[Algorithm]:
        if "update_aux" in vars(cls):  # the protocol before models were declared as roles
            raise TypeError(f"{cls.__name__}.update_aux is no longer called: declare the model as a Role in "
                            f"`needs` (trainable=True, loss=...) and the engine trains it after the policy")  # fmt: skip
        REGISTRY.add(name, cls)
        cls.name = name
        doc = (cls.__doc__ or "").strip()
        cls.summary = summary or (doc.splitlines()[0] if doc else "")
        _store_config(name, cls.config_class)
        return cls

    return wrap


def _store_config(name: str, config_class: type[AlgoConfig]) -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="algo", name=name, node=config_class(name=name))


def load_plugins(modules: list[str] | tuple[str, ...] = ()) -> None:
    """Import built-ins, entry points (group ``harness.algorithms``) and a run's ``plugins`` modules."""
    REGISTRY.load()
    import_plugins(modules)


def available() -> list[str]:
    return REGISTRY.names()


def did_you_mean(name: str) -> str:
    """' (did you mean 'grpo'?)' for a near miss among the registered algorithms, else ''."""
    return REGISTRY.did_you_mean(name)


def builtin() -> dict[str, type[Algorithm]]:
    """Every algorithm registered by a module of this package (not plugins), by name."""
    return {name: cls for name, cls in REGISTRY.entries().items() if cls.__module__.startswith("algorithms.")}


def summaries() -> dict[str, str]:
    return {n: c.summary for n, c in REGISTRY.entries().items()}


def get_class(name: str) -> type[Algorithm]:
    return REGISTRY.get(name)


def build(cfg) -> Algorithm:
    """Instantiate the algorithm named by ``cfg.name`` from a (DictConfig or dataclass) config."""
    from omegaconf import OmegaConf

    cls = get_class(cfg.name)
    if not isinstance(cfg, cls.config_class):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls.config_class), cfg))
    return cls(cfg)
