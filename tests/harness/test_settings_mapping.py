"""Every config field reaches the runtime by name, or is listed as the driver's own.

Each config leaf gets a value no other leaf has (booleans are flipped one at a time); the settings
``runtime_settings`` builds are then traced back to the config field each value came from. A
settings field must come from the config field of its own name (or the path RENAMED_SETTINGS names),
and each config field must reach a settings field or match DRIVER_ONLY, never both.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import typing

from omegaconf import OmegaConf

from harness import config as config_module
from harness.config import DRIVER_ONLY, RENAMED_SETTINGS, Config, compose_config, runtime_settings


def config_leaves(cls: type = Config, prefix: str = "") -> dict[str, object]:
    """Dotted path -> type hint of every leaf field of the structured config (algo is the algorithm's own)."""
    leaves: dict[str, object] = {}
    for name, hint in typing.get_type_hints(cls, vars(config_module)).items():
        if name in ("defaults", "algo"):
            continue
        if dataclasses.is_dataclass(hint):
            leaves.update(config_leaves(hint, f"{prefix}{name}."))
        else:
            leaves[f"{prefix}{name}"] = hint
    return leaves


def settings_leaves(obj: object, owner: str = "") -> dict[tuple[str, str], object]:
    """(settings class, field) -> value of every leaf of a settings tree."""
    leaves: dict[tuple[str, str], object] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            leaves.update(settings_leaves(value))
        else:
            leaves[type(obj).__name__, f.name] = value
    return leaves


def sentinel(i: int, hint: object) -> object:
    """A value of the field's type that no other field gets; None for booleans (flipped instead)."""
    if hint is int:
        return 100_000 + i
    if hint is float:
        return 0.5 + i
    if hint is str:
        return f"s{i}"
    if typing.get_origin(hint) in (list, tuple):
        return [f"s{i}"] if typing.get_args(hint)[0] is str else [0.25 + i, 0.75 + i]
    return None  # bool, bool | None


def trace() -> dict[str, list[tuple[str, str]]]:
    """Config path -> the settings fields its value reached."""
    cfg, leaves = compose_config([]), config_leaves()
    by_value: dict[object, str] = {}
    flips: list[str] = []
    for i, (path, hint) in enumerate(sorted(leaves.items())):
        value = sentinel(i, hint)
        if value is None:
            flips.append(path)
            continue
        OmegaConf.update(cfg, path, value)
        by_value[tuple(value) if isinstance(value, list) else value] = path
    reached: dict[str, list[tuple[str, str]]] = {path: [] for path in leaves}
    base = settings_leaves(runtime_settings(cfg))
    for key, value in base.items():
        if isinstance(value, (int, float, str, tuple)) and not isinstance(value, bool) and value in by_value:
            reached[by_value[value]].append(key)
    for path in flips:  # a boolean reaches the settings fields that change when it flips
        flipped = cfg.copy()
        OmegaConf.update(flipped, path, not OmegaConf.select(cfg, path))
        reached[path] += [key for key, value in settings_leaves(runtime_settings(flipped)).items() if value != base[key]]
    return reached


def driver_only(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in DRIVER_ONLY)


def test_every_config_field_reaches_the_runtime_by_name_or_is_driver_only():
    reached = trace()
    for path, keys in reached.items():
        if driver_only(path):
            assert not keys, f"{path} is listed in DRIVER_ONLY but reaches {keys}"
            continue
        assert keys, f"{path} reaches no runtime setting: map it (runtime_settings) or list it in DRIVER_ONLY"
        for cls, name in keys:
            renamed = RENAMED_SETTINGS.get((cls, name))
            assert path == renamed if renamed else path.rsplit(".", 1)[-1] == name, (
                f"{cls}.{name} comes from {path}: a settings field takes the config field of its own name "
                "(or the path in RENAMED_SETTINGS)"
            )


def test_every_settings_field_comes_from_the_config():
    reached = trace()
    sources = {key for keys in reached.values() for key in keys}
    missing = set(settings_leaves(runtime_settings(compose_config([])))) - sources
    assert not missing, f"settings fields no config field sets: {sorted(missing)}"


def test_driver_only_patterns_all_match_a_field():
    leaves = config_leaves()
    for pattern in DRIVER_ONLY:
        assert any(fnmatch.fnmatchcase(path, pattern) for path in leaves), f"DRIVER_ONLY entry {pattern!r} matches no field"


def test_a_config_read_back_from_yaml_gives_the_same_settings():
    """A run's saved config.yaml is untyped (``lr: 1`` is an int there); settings cast it to the field's type."""
    cfg = compose_config(["trainer.lr=1", "rollout.temperature=1"])
    loaded = OmegaConf.create(OmegaConf.to_yaml(cfg))
    OmegaConf.update(loaded, "trainer.lr", 1)  # an int, as a hand-edited YAML would have it
    settings = runtime_settings(loaded)
    assert settings.train.optimizer.lr == 1.0 and isinstance(settings.train.optimizer.lr, float)
    assert settings == runtime_settings(cfg)
