"""harness baselines: bands from runs, the check's verdicts, and a shifted algorithm caught end to end."""

from __future__ import annotations

import json

import pytest
import yaml
from fake_runs import make_run

from analysis.baselines import check, make_bands
from analysis.collect import collect
from harness.commands.cli import _cmd_baselines


def _runs(root, shift: float = 0.0):
    for seed in (0, 1, 2):
        make_run(root, algo="grpo", seed=seed, final_acc=0.40 + 0.02 * seed + shift)
        make_run(root, algo="rloo", seed=seed, final_acc=0.30 + 0.02 * seed)
    return collect([root]).runs


def test_bands_by_hand_and_verdicts(tmp_path):
    runs = _runs(tmp_path / "a")
    bands = make_bands(runs, min_margin=0.01, se_multiple=3.0)
    # grpo finals 0.40/0.42/0.44: mean 0.42, std 0.02, se 0.02/sqrt(3); half-width 3 x sqrt(2) x se = 0.049
    g = bands["grpo"]["eval_final"]
    assert g["measured"] == pytest.approx(0.42) and g["seed_std"] == pytest.approx(0.02)
    half = 3 * 2**0.5 * 0.02 / 3**0.5
    assert (g["lo"], g["hi"]) == (pytest.approx(0.42 - half), pytest.approx(0.42 + half))
    results, missing = check(runs, bands)
    assert not missing and all(r.ok for r in results)

    shifted = _runs(tmp_path / "b", shift=-0.06)  # grpo 0.06 lower: leaves its band; rloo unchanged
    results, missing = check(shifted, bands)
    bad = {(r.algo, r.metric) for r in results if not r.ok}
    assert ("grpo", "eval_final") in bad and not any(a == "rloo" for a, _ in bad)
    _, missing = check(shifted[shifted["algo"] == "grpo"], bands)
    assert missing == ["rloo"]
    results, _ = check(runs[runs["seed"] != 2], bands)  # a crashed seed: fails even if in band
    assert not any(r.ok for r in results if r.algo == "grpo")
    assert {r.verdict for r in results if r.algo == "grpo"} == {"SEEDS 2/3"}


def test_cli_exit_codes_on_existing_runs(tmp_path, capsys):
    preset = tmp_path / "pins.yaml"
    preset.write_text(yaml.safe_dump({"description": "test", "sweep": {"algo": ["grpo", "rloo"]}, "overrides": []}))
    _runs(tmp_path / "good")
    assert _cmd_baselines(["record", "--preset", str(preset), "--out", str(tmp_path / "good"), "--no-run",
                           "--min-margin", "0.01"]) == 0
    bands = json.loads((tmp_path / "pins.bands.json").read_text())
    assert set(bands["bands"]) == {"grpo", "rloo"} and bands["min_margin"] == 0.01
    assert _cmd_baselines(["check", "--preset", str(preset), "--out", str(tmp_path / "good"), "--no-run"]) == 0
    _runs(tmp_path / "bad", shift=0.1)
    assert _cmd_baselines(["check", "--preset", str(preset), "--out", str(tmp_path / "bad"), "--no-run"]) == 1
    out = capsys.readouterr().out
    assert "OUT OF BAND" in out and "baselines check failed" in out and "CPU flags" in out
    assert _cmd_baselines(["check", "--preset", str(tmp_path / "nope.yaml"), "--no-run", "--out", "x"]) == 2
    assert _cmd_baselines(["check", "--preset", str(preset), "--no-run"]) == 2  # --no-run needs --out


@pytest.mark.integration
def test_check_reruns_and_catches_a_shifted_algorithm(tmp_path, monkeypatch):
    """Record real runs, re-run: identical, passes; flip GRPO's advantage sign: out of band, exit 1."""
    preset = tmp_path / "pins.yaml"
    preset.write_text(yaml.safe_dump({
        "description": "grpo, one seed, 6k tokens (in-process launcher, so the monkeypatch reaches the run)",
        "sweep": {"algo": ["grpo"], "seed": [0]},
        "overrides": ["trainer.budget=tokens", "trainer.budget_tokens=6000", "trainer.steps=100",
                      "trainer.prompts_per_step=16", "trainer.eval_every_tokens=3000", "trainer.lr=1e-3",
                      "task.eval_prompts=64", "runtime.threads=1", "hydra/launcher=basic"],
    }))
    assert _cmd_baselines(["record", "--preset", str(preset), "--out", str(tmp_path / "rec"), "--min-margin", "0"]) == 0
    assert _cmd_baselines(["check", "--preset", str(preset), "--out", str(tmp_path / "same")]) == 0

    import algorithms.grpo

    original = algorithms.grpo.GRPO.advantages
    def reversed_advantages(self, batch):  # a sign error: the policy moves away from the reward
        adv, metrics = original(self, batch)
        return -adv, metrics

    monkeypatch.setattr(algorithms.grpo.GRPO, "advantages", reversed_advantages)
    assert _cmd_baselines(["check", "--preset", str(preset), "--out", str(tmp_path / "shifted")]) == 1
