"""Every sweeps/*.yaml preset composes against the real config (each swept value), pending fields aside."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.commands.presets import (
    PresetError,
    control_sweeps,
    load_preset,
    merge_overrides,
    preset_controls,
    read_preset,
    resolve_preset,
    suite_member_overrides,
    suite_members,
)

SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
PRESETS = sorted(SWEEPS.glob("*.yaml"))


def _compose(overrides):
    from conftest import compose

    return compose(overrides)


def _expand(overrides: list[str]) -> list[list[str]]:
    """Jobs covering every swept value: comma-separated values expanded (hydra.* overrides dropped for compose)."""
    fixed, swept = [], []
    for o in overrides:
        key, _, value = o.partition("=")
        if key.startswith("hydra."):
            continue
        if "," in value and not value.startswith("["):
            swept.append([f"{key}={v}" for v in value.split(",")])
        else:
            fixed.append(o)
    if not swept:
        return [fixed]
    # Each value of each swept key once (others at their first value): every value is checked
    # without composing the whole cartesian product.
    jobs = []
    for i, values in enumerate(swept):
        for v in values:
            jobs.append(fixed + [v] + [s[0] for j, s in enumerate(swept) if j != i])
    return list({tuple(j): j for j in jobs}.values())


def _sweeps(preset: Path) -> list[list[str]]:
    """The override lists ``harness sweep --preset`` launches: one, one per member of a suite, or the grid and
    one per control arm."""
    members = suite_members(preset)
    if members:
        return [suite_member_overrides(preset, m, []) for m in members]
    return control_sweeps(preset, []) if preset_controls(preset) else [load_preset(preset)]


def test_presets_exist():
    assert {p.stem for p in PRESETS} >= {"quick", "gsm8k_qwen0.5b", "math_qwen1.5b"}


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_composes(preset):
    from harness.config import validate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sweeps = _sweeps(preset)
    assert all(any(o.startswith("hydra.sweep.dir=") for o in overrides) for overrides in sweeps)
    jobs = [job for overrides in sweeps for job in _expand(overrides)]
    assert len(jobs) >= 2
    for job in jobs:
        cfg = _compose(job)
        validate(cfg)  # batch sizes divide, known checker/backend/precision
        for o in job:
            key, _, value = o.partition("=")
            if "/" in key or key in ("algo", "task", "rollout", "model", "trainer", "runtime"):
                continue
            assert str(OmegaConf.select(cfg, key)).lower() == str(value).lower() or float(OmegaConf.select(cfg, key)) == float(value), o


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_pending_fields_really_are_missing(preset):
    """When a pending field lands in harness/config.py, remove it from `pending:` in the preset."""
    for key in read_preset(preset).get("pending") or []:
        cfg = _compose([])
        assert OmegaConf.select(cfg, key, default="__missing__") == "__missing__", (
            f"{preset.name}: {key} exists now; drop it from 'pending'"
        )
        assert any(o.startswith(f"{key}=") for o in read_preset(preset)["overrides"])
        with pytest.warns(UserWarning, match=key):
            assert not any(o.startswith(f"{key}=") for o in load_preset(preset))
        assert any(o.startswith(f"{key}=") for o in load_preset(preset, include_pending=True))


def test_arith_all_sweeps_every_builtin_algorithm_on_quicks_setting():
    """arith_all (the full table) sweeps every built-in algorithm, 5 seeds each, with the run settings of
    quick (make run's subset) and newer (the 2025 families against grpo), so their rows are the same runs."""
    from harness.commands.docs_gen import builtin_algorithms

    full, quick, newer = (load_preset(SWEEPS / f"{name}.yaml") for name in ("arith_all", "quick", "newer"))
    algos = {name: set(next(o for o in ov if o.startswith("algo=")).split("=", 1)[1].split(","))
             for name, ov in (("arith_all", full), ("quick", quick), ("newer", newer))}  # fmt: skip
    assert algos["arith_all"] == set(builtin_algorithms())
    assert "grpo" in algos["quick"] < algos["arith_all"] and "grpo" in algos["newer"] < algos["arith_all"]
    for ov in (full, quick, newer):
        assert "seed=0,1,2,3,4" in ov
    same = [o for o in quick if not o.startswith(("algo=", "hydra.sweep.dir="))]
    for ov in (full, newer):
        assert same == [o for o in ov if not o.startswith(("algo=", "hydra.sweep.dir="))]
    assert "model.path=tiny" in quick and "task=arith" in quick


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_compares_at_an_equal_token_budget(preset):
    """Samples per prompt and extra generation must cost budget, not buy an advantage."""
    from harness.commands.cli import budget_warning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sweeps = _sweeps(preset)
    for ov in sweeps:
        assert "trainer.budget=tokens" in ov and any(o.startswith("trainer.budget_tokens=") for o in ov)
        assert any(o.startswith("trainer.eval_every_tokens=") for o in ov)  # evals at the same budget points
        assert budget_warning(ov) is None


def test_a_suite_runs_each_member_with_the_suites_algorithms_and_seeds(tmp_path):
    suite = SWEEPS / "suite_cpu.yaml"
    assert [m.stem for m in suite_members(suite)] == ["quick", "calculator"]
    quick, calc = (suite_member_overrides(suite, m, ["seed=0"]) for m in suite_members(suite))
    for ov, task in ((quick, "task=arith"), (calc, "task=arith_calc")):
        assert task in ov and "algo=grpo,rloo,dr_grpo" in ov and ov[-1] == "seed=0"  # the user's last
        assert not any(o.startswith("seed=0,1") for o in ov)
    assert "hydra.sweep.dir=results/sweeps/suite_cpu/quick" in quick and "env.name=calculator" in calc
    moved = suite_member_overrides(suite, suite_members(suite)[1], [f"hydra.sweep.dir={tmp_path}"])
    assert f"hydra.sweep.dir={tmp_path / 'calculator'}" in moved  # the user's dir holds the members
    # a suite that sweeps a key its member fixes: the key names the run dirs; the suite's fixed keys do not
    (tmp_path / "quick.yaml").write_text((SWEEPS / "quick.yaml").read_text())
    (tmp_path / "budgets.yaml").write_text("members: [quick]\nsweep:\n  trainer.budget_tokens: [1000, 2000]\n"
                                           "overrides:\n  - trainer.lr=1e-4\n")
    ov = suite_member_overrides(tmp_path / "budgets.yaml", tmp_path / "quick.yaml", [])
    exclude = next(o for o in ov if o.startswith("hydra.job.config.override_dirname.exclude_keys="))
    assert "trainer.budget_tokens" not in exclude and "trainer.lr" in exclude and "trainer.budget_tokens=1000,2000" in ov
    (tmp_path / "inner.yaml").write_text("members: [quick]\n")
    (tmp_path / "outer.yaml").write_text("members: [inner]\n")
    with pytest.raises(PresetError, match="member 'inner' is itself a suite"):
        suite_members(tmp_path / "outer.yaml")
    (tmp_path / "bad.yaml").write_text("members: [no_such_preset]\n")
    with pytest.raises(PresetError, match="member 'no_such_preset'"):
        suite_members(tmp_path / "bad.yaml")


def test_control_arms_run_over_the_grids_seeds_into_its_folder(tmp_path):
    """make run's preset: the grid, then the random-reward arm, which takes the user's seeds, lands in the
    same folder and is named by its own keys; a command line that sets algo or an algo.* knob (an
    ablation) runs the grid alone."""
    preset = SWEEPS / "reasoning_quick.yaml"
    grid, control = control_sweeps(preset, ["seed=0"])
    assert "algo=ppo,grpo,rloo" in grid and "seed=0" in grid and "reward.source=random" not in grid
    assert "algo=grpo" in control and "seed=0" in control
    assert "reward.source=random" in control and "reward.random_rate=0.29" in control
    assert [o for o in grid if o.startswith("hydra.sweep.dir=")] == [o for o in control if o.startswith("hydra.sweep.dir=")]
    exclude = next(o for o in control if o.startswith("hydra.job.config.override_dirname.exclude_keys="))
    assert "reward.source" not in exclude and "reward.random_rate" not in exclude  # they name the control's run dirs
    for ablation in (["algo=rloo"], ["algo.clip_high=0.28"]):
        assert control_sweeps(preset, ablation) == [merge_overrides(load_preset(preset), ablation)]
    (tmp_path / "bad.yaml").write_text("sweep:\n  seed: [0]\ncontrols:\n  - algo=grpo\n")
    with pytest.raises(PresetError, match="'controls' must be a list of lists of KEY=VALUE"):
        preset_controls(tmp_path / "bad.yaml")


def test_a_control_arm_that_changes_fixed_keys_is_named_by_them():
    """mismatch_async's default-user arm changes a key the preset fixes (trainer.behaviour_logp=recompute), which the
    grid's run dirs are not named by: the arm's run dirs must be, or they would be the grid's (found: the arm was
    refused by the run dir of the grid's first correction, seed 0)."""
    grid, none, default = control_sweeps(SWEEPS / "mismatch_async.yaml", [])
    exclude = {o.split("=", 1)[0]: o for o in default}["hydra.job.config.override_dirname.exclude_keys"]
    assert "trainer.behaviour_logp" not in exclude and "correction.name" not in exclude
    assert "correction.low" in exclude  # a fixed key the arm leaves alone still names nothing
    grid_exclude = {o.split("=", 1)[0]: o for o in grid}["hydra.job.config.override_dirname.exclude_keys"]
    assert "trainer.behaviour_logp" in grid_exclude
    assert "correction.name=none" in none and "trainer.behaviour_logp=behaviour" not in none


def test_sweep_warns_before_launch_on_unequal_budgets():
    from harness.commands.cli import budget_warning

    warning = budget_warning(["algo=grpo,dapo,remax", "seed=0,1"])
    assert "unequal budgets" in warning and "dapo: 16 samples/prompt" in warning and "greedy" in warning
    assert "trainer.budget=tokens" in warning
    assert budget_warning(["algo=grpo,dapo", "trainer.budget=tokens", "trainer.budget_tokens=1000"]) is None
    assert budget_warning(["algo=grpo,rloo"]) is None  # same samples, no extra generation
    assert budget_warning(["algo=grpo,prime", "algo.samples_per_prompt=8"]) is not None  # prime still refills
    assert "trainer.steps is swept" in budget_warning(["algo=grpo", "trainer.steps=10,20"])
    assert "trainer.budget_tokens is swept" in budget_warning(
        ["algo=grpo", "trainer.budget=tokens", "trainer.budget_tokens=10,20"])


def test_merge_user_overrides_win_and_loader_errors(tmp_path):
    merged = merge_overrides(["algo=grpo,ppo", "seed=0,1", "trainer.steps=10"], ["seed=5", "+foo=1"])
    assert merged == ["algo=grpo,ppo", "trainer.steps=10", "seed=5", "+foo=1"]
    # another launcher: the preset's launcher settings (joblib's n_jobs) go with its launcher
    merged = merge_overrides(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=0"],
                             ["hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug"])  # fmt: skip
    assert merged == ["seed=0", "hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug"]
    assert resolve_preset("quick", SWEEPS) == SWEEPS / "quick.yaml"
    with pytest.raises(PresetError, match="unknown preset"):
        resolve_preset("nope", SWEEPS)
    bad = tmp_path / "bad.yaml"
    bad.write_text("sweep: {seed: [0]}\nfoo: 1\n")
    with pytest.raises(PresetError, match="unknown key"):
        load_preset(bad)
    bad.write_text("overrides: [trainer.steps]\n")
    with pytest.raises(PresetError, match="KEY=VALUE"):
        load_preset(bad)
    ok = tmp_path / "ok.yaml"
    ok.write_text("sweep: {seed: [0, 1], algo.scale_by_std: [true, false]}\noverrides: [algo=grpo]\n")
    assert load_preset(ok, name_by_swept_keys=False) == ["algo=grpo", "seed=0,1", "algo.scale_by_std=true,false"]
    assert load_preset(ok)[-1].endswith(",trainer.steps,runtime.threads,algo]")


def test_run_dirs_named_by_swept_keys_only():
    from hydra import compose, initialize_config_module

    _compose([])  # registers the configs and the harness_run_name resolver
    ov = load_preset(SWEEPS / "quick.yaml")
    excl = next(o for o in ov if o.startswith("hydra.job.config.override_dirname.exclude_keys="))
    job = _expand(ov)[0] + [excl]
    with initialize_config_module("harness.conf", version_base=None):
        cfg = compose("harness", overrides=job, return_hydra_config=True)
    keys = set(cfg.hydra.job.config.override_dirname.exclude_keys)
    assert {"trainer.steps", "run_dir", "model.path", "trainer.prompts_per_step"} <= keys
    assert "algo" not in keys and "seed" not in keys


def test_sweep_preset_help_says_what_the_preset_runs(capsys):
    """`harness sweep --preset NAME --help` prints the preset's grid, control arms and overrides (Hydra alone would
    refuse the arms' keys as unrecognized arguments)."""
    from harness.commands.cli import main

    main(["sweep", "--preset", "mismatch_int3", "--help"])
    out = capsys.readouterr().out
    assert "grid: rollout.weight_quant = ['none', 'int3']" in out
    assert "control arm: rollout.weight_quant=int3 correction.name=tis correction.cap=2" in out
    assert "trainer.budget_tokens=50000" in out and "run it: harness sweep --preset mismatch_int3" in out
    with pytest.raises(SystemExit, match="unknown preset 'nosuch'"):
        main(["sweep", "--preset", "nosuch", "-h"])
