"""Sweep presets (``sweeps/*.yaml``) -> Hydra multirun override strings.

A preset is plain data::

    description: one line, shown by the CLI
    sweep:                      # swept keys -> values (a list, or a Hydra sweep string)
      algo: all                 #   'all' = every registered algorithm (algorithms.available())
      seed: [0, 1]
    overrides:                  # fixed Hydra overrides, as on the command line
      - trainer.steps=20
    sweep_dir: results/sweeps/quick   # -> hydra.sweep.dir (optional)
    pending:                    # fields the config does not have yet: their overrides are dropped
      - rollout.vllm.swap_space_gib   # (with a warning) until harness/config.py gains them

Control arms run beside the grid, over its other swept keys (its seeds), into the same folder::

    controls:                   # each: overrides that replace the grid's (a random-reward GRPO)
      - [algo=grpo, reward.source=random, reward.random_rate=0.3]

A positive-controls preset also states, under ``verdicts:``, what each control predicts (the arms by config
values, the diagnostic that shows the mechanism acted, the predicted metric and direction); sweeps ignore it and
``harness report DIR --controls PRESET`` applies it (analysis/controls.py, sweeps/controls.yaml).

A suite preset names other presets instead: ``members: [quick, calculator]``; ``harness sweep``
runs each member preset in turn, with the suite's ``sweep`` and ``overrides`` replacing the
member's (the same algorithms and seeds on every task), into ``<sweep_dir>/<member>``; the
report of ``<sweep_dir>`` then aggregates over the tasks (analysis/suite.py).

``load_preset(path)`` returns the override list for ``harness sweep``;
``merge_overrides(preset, user)`` lets command-line overrides replace the preset's
(``harness sweep --preset sweeps/quick.yaml seed=0,1,2`` sweeps three seeds).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import yaml

# verdicts: what a positive-controls preset predicts per control (analysis/controls.py reads it; sweeps ignore it)
PRESET_KEYS = {"description", "sweep", "overrides", "sweep_dir", "pending", "members", "controls", "verdicts"}


class PresetError(ValueError):
    """A malformed preset file (the message names the file and the field)."""


def _key(override: str) -> str:
    """The config key an override sets: '+a.b=1' -> 'a.b', '~a' -> 'a', 'hydra/launcher=x' -> 'hydra/launcher'."""
    return override.split("=", 1)[0].lstrip("+~").strip()


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def read_preset(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise PresetError(f"preset {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise PresetError(f"preset {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise PresetError(f"preset {path}: expected a mapping with keys {sorted(PRESET_KEYS)}")
    unknown = set(data) - PRESET_KEYS
    if unknown:
        raise PresetError(f"preset {path}: unknown key(s) {sorted(unknown)}; allowed: {sorted(PRESET_KEYS)}")
    return data


def base_exclude_keys() -> list[str]:
    """``hydra.job.config.override_dirname.exclude_keys`` of harness/conf/harness.yaml."""
    conf = Path(__file__).resolve().parents[1] / "conf" / "harness.yaml"
    data = yaml.safe_load(conf.read_text())
    return list(data["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"])


def load_preset(path: str | Path, include_pending: bool = False, name_by_swept_keys: bool = True) -> list[str]:
    """Override strings for ``harness sweep`` (fixed overrides, then the swept keys, then hydra.* settings).

    Overrides of fields listed under ``pending`` are dropped with a warning unless
    ``include_pending`` (they would fail composition until the config has them). With
    ``name_by_swept_keys`` the preset's fixed keys are added to Hydra's override_dirname
    exclude list, so runs land in ``<sweep_dir>/algo=grpo,seed=0`` (the fixed settings are
    in each run's config.yaml; a run dir refuses a different config, so nothing mixes).
    Keys the user adds on the command line still name the runs.
    """
    data = read_preset(path)
    pending = set(data.get("pending") or [])
    fixed = data.get("overrides") or []
    if not isinstance(fixed, list) or not all(isinstance(o, str) and "=" in o for o in fixed):
        raise PresetError(f"preset {path}: 'overrides' must be a list of KEY=VALUE strings")
    out, dropped = [], []
    for o in fixed:
        if _key(o) in pending and not include_pending:
            dropped.append(o)
        else:
            out.append(o)
    sweep = data.get("sweep") or {}
    if not isinstance(sweep, dict):
        raise PresetError(f"preset {path}: 'sweep' must map keys to lists of values")
    for key, values in sweep.items():
        if key == "algo" and values == "all":
            import algorithms

            values = algorithms.available()
        if isinstance(values, list):
            if not values:
                raise PresetError(f"preset {path}: sweep.{key} is empty")
            values = ",".join(_value(v) for v in values)
        out.append(f"{key}={_value(values)}")
    if data.get("sweep_dir"):
        out.append(f"hydra.sweep.dir={data['sweep_dir']}")
    if name_by_swept_keys:
        # Run directories named by the swept keys only (algo=grpo,seed=0), not by every fixed override.
        fixed_keys = [_key(o) for o in out if not _key(o).startswith("hydra") and _key(o) not in sweep]
        keys = list(dict.fromkeys(base_exclude_keys() + fixed_keys))
        out.append(f"hydra.job.config.override_dirname.exclude_keys=[{','.join(keys)}]")
    if dropped:
        warnings.warn(f"preset {path}: not applied (field not in the config yet): {', '.join(dropped)}", stacklevel=2)
    return out


def merge_overrides(preset: list[str], user: list[str]) -> list[str]:
    """Preset overrides, minus those whose key the user sets, then the user's (the user wins).

    A user's ``hydra/launcher=X`` also drops the preset's ``hydra.launcher.*`` settings: they
    configure the preset's launcher (joblib's n_jobs), which the other launcher does not have."""
    user_keys = {_key(o) for o in user}
    other_launcher = "hydra/launcher" in user_keys
    return [o for o in preset if _key(o) not in user_keys
            and not (other_launcher and _key(o).startswith("hydra.launcher."))] + list(user)  # fmt: skip


def preset_controls(path: str | Path) -> list[list[str]]:
    """A preset's control arms: lists of overrides, each run as its own sweep over the grid's seeds."""
    controls = read_preset(path).get("controls") or []
    if not isinstance(controls, list) or not all(
            isinstance(c, list) and c and all(isinstance(o, str) and "=" in o for o in c) for c in controls):
        raise PresetError(f"preset {path}: 'controls' must be a list of lists of KEY=VALUE strings, e.g. "
                          f"[[algo=grpo, reward.source=random, reward.random_rate=0.3]]")  # fmt: skip
    return controls


def narrows_algorithms(user: list[str]) -> bool:
    """Whether command-line overrides set ``algo`` or an ``algo.*`` knob: an ablation or a subset of the
    grid, which the preset's control arms were not chosen for."""
    return any(_key(o) == "algo" or _key(o).startswith("algo.") for o in user)


def control_sweeps(path: str | Path, user: list[str]) -> list[list[str]]:
    """``harness sweep --preset`` of a preset with controls: the grid's overrides (preset, then the
    user's), then one sweep per control arm (the grid's, then the arm's keys). The arms' keys name
    their run directories (``algo=grpo,reward.random_rate=0.3,reward.source=random,seed=0``) beside
    the grid's. When the user sets ``algo`` or an ``algo.*`` knob (an ablation such as
    ``algo=dapo algo.clip_high=0.2``) only the grid runs: the arms control the preset's own comparison."""
    grid = merge_overrides(load_preset(path), user)
    if narrows_algorithms(user):
        return [grid]
    return [grid, *(_named_by(merge_overrides(grid, arm), arm) for arm in preset_controls(path))]


def _named_by(overrides: list[str], arm: list[str]) -> list[str]:
    """An arm's keys name its run directories, also a key the preset fixes (whose name the grid leaves out):
    else an arm that only changes fixed keys (``correction.name=none``) would land in the grid's directories."""
    prefix = "hydra.job.config.override_dirname.exclude_keys="
    arm_keys = {_key(o) for o in arm}
    out = []
    for o in overrides:
        if o.startswith(prefix):
            kept = [k for k in o[len(prefix):].strip("[]").split(",") if k and k not in arm_keys]
            o = f"{prefix}[{','.join(kept)}]"
        out.append(o)
    return out


def suite_members(path: str | Path) -> list[Path]:
    """A suite preset's member presets, resolved (beside the suite first); [] for a plain preset."""
    path = Path(path)
    members = read_preset(path).get("members") or []
    if not isinstance(members, list) or not all(isinstance(m, str) and m for m in members):
        raise PresetError(f"preset {path}: 'members' must be a list of preset names")
    resolved = []
    for name in members:
        try:
            member = resolve_preset(name, path.parent) if (path.parent / f"{name}.yaml").exists() else resolve_preset(name)
        except PresetError as exc:
            raise PresetError(f"preset {path}: member {name!r}: {exc}") from None
        if read_preset(member).get("members"):
            raise PresetError(f"preset {path}: member {name!r} is itself a suite; list its members instead")
        resolved.append(member)
    return resolved


def suite_member_overrides(suite: str | Path, member: str | Path, user: list[str]) -> list[str]:
    """One member's sweep: the member preset, then the suite's settings and swept keys, then the user's
    overrides (each replacing the keys before it), into ``<suite sweep_dir>/<member>``."""
    data, exclude_key = read_preset(suite), "hydra.job.config.override_dirname.exclude_keys"
    shared = [o for o in load_preset(suite, name_by_swept_keys=False) if _key(o) != "hydra.sweep.dir"]
    base = data.get("sweep_dir") or f"results/sweeps/{Path(suite).stem}"
    base = next((o.split("=", 1)[1] for o in user if _key(o) == "hydra.sweep.dir"), base)  # the user's: the suite's dir
    user = [o for o in user if _key(o) != "hydra.sweep.dir"]
    into = f"hydra.sweep.dir={Path(base) / Path(member).stem}"
    merged = merge_overrides(merge_overrides(load_preset(member), [*shared, into]), user)
    # Run dirs named by the swept keys: the suite's fixed keys join the member's exclude list, the keys the
    # suite sweeps leave it (a key the member fixes and the suite sweeps must name the runs).
    swept = set(data.get("sweep") or {})
    fixed = [_key(o) for o in data.get("overrides") or []]
    for i, o in enumerate(merged):
        if _key(o) == exclude_key:
            keys = [k for k in o.split("=", 1)[1].strip("[]").split(",") if k]
            keys = [k for k in dict.fromkeys(keys + fixed) if k not in swept]
            merged[i] = f"{exclude_key}=[{','.join(keys)}]"
    return merged


def available_presets(directory: str | Path = "sweeps") -> dict[str, str]:
    """name -> description of every preset in ``directory``."""
    out = {}
    for p in sorted(Path(directory).glob("*.yaml")):
        try:
            out[p.stem] = str(read_preset(p).get("description", "")).strip()
        except PresetError as exc:
            out[p.stem] = f"(invalid: {exc})"
    return out


def preset_dirs() -> list[Path]:
    """Where preset names are looked up: ./sweeps, then the sweeps/ folder next to this package."""
    return [Path.cwd() / "sweeps", Path(__file__).resolve().parents[2] / "sweeps"]


def resolve_preset(name_or_path: str, directory: str | Path | None = None) -> Path:
    """'quick' -> sweeps/quick.yaml (./sweeps, then the checkout's sweeps/); a path must exist."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise PresetError(f"preset {p} does not exist")
        return p
    dirs = [Path(directory)] if directory is not None else preset_dirs()
    for d in dirs:
        cand = d / f"{name_or_path}.yaml"
        if cand.exists():
            return cand
    names = sorted({n for d in dirs for n in available_presets(d)})
    raise PresetError(f"unknown preset {name_or_path!r} (looked in {', '.join(map(str, dirs))}); "
                      f"presets: {', '.join(names) or 'none'}")
