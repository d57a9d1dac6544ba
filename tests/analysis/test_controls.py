"""Positive controls' verdicts (analysis/controls.py, scripts/control_verdicts.py) on fake sweeps whose effects
are known: the predicted direction at p < 0.05 is 'reproduced', a diagnostic under its floor 'not testable', an
effect that does not show 'not reproduced'; Holm over the controls; several arms must all differ."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from fake_runs import make_run

from analysis import controls
from analysis.collect import collect

ROOT = Path(__file__).resolve().parents[2]


def _run(root, algo, seed, knobs: dict, shift: dict[str, float]):
    """A fake run with ``knobs`` in its algo config and ``shift`` added to those metrics at every step."""
    d = make_run(root, algo=algo, seed=seed, steps=8, eval_every=4, extra_algo=knobs,
                 name=f"{algo}-{'-'.join(f'{k}{v}' for k, v in knobs.items())}-s{seed}")
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    rng = np.random.default_rng(seed)
    for r in rows:
        if r["step"] > 0:
            for k, v in shift.items():
                r[k] = r.get(k, 0.0) + v + float(rng.normal(0, 0.01))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


SPEC = [
    {"control": "clip-higher", "mechanism": "m", "arm": {"algo.name": "dapo", "algo.epochs": 4, "algo.clip_high": 0.28},
     "versus": {"algo.name": "dapo", "algo.epochs": 4, "algo.clip_high": 0.2},
     "acts": {"metric": "policy/clipfrac", "window": "first", "of": "versus", "min": 0.1},
     "predict": {"metric": "policy/entropy", "window": "last_quarter", "direction": "higher"}},
    {"control": "overlong", "mechanism": "m", "arm": {"algo.name": "dapo", "algo.overlong_penalty": 1.0},
     "versus": {"algo.name": "dapo", "algo.overlong_penalty": 0.0},
     "acts": {"metric": "rollout/truncated_frac", "window": "first", "of": "both", "min": 0.1},
     "predict": {"metric": "rollout/truncated_frac", "window": "last_quarter", "direction": "lower"}},
    {"control": "ratio", "mechanism": "m", "arm": [{"algo.name": "gspo"}, {"algo.name": "cispo"}],
     "versus": {"algo.name": "grpo"},
     "acts": {"metric": "policy/approx_kl", "window": "all", "of": "versus", "min": 0.001},
     "predict": {"metric": "policy/clipfrac", "window": "all", "direction": "differs"}},
]


def _sweep(root, entropy_gain=0.2, clipfrac=0.3, truncated=0.0, cispo_clip=0.1):
    for s in range(4):
        _run(root, "dapo", s, {"epochs": 4, "clip_high": 0.28}, {"policy/entropy": entropy_gain, "policy/clipfrac": clipfrac})
        _run(root, "dapo", s, {"epochs": 4, "clip_high": 0.2}, {"policy/clipfrac": clipfrac})
        _run(root, "dapo", s, {"overlong_penalty": 1.0}, {"rollout/truncated_frac": truncated})
        _run(root, "dapo", s, {"overlong_penalty": 0.0}, {"rollout/truncated_frac": truncated})
        _run(root, "grpo", s, {}, {"policy/approx_kl": 0.01, "policy/clipfrac": 0.02})
        _run(root, "gspo", s, {}, {"policy/clipfrac": 0.3})
        _run(root, "cispo", s, {}, {"policy/clipfrac": cispo_clip})
    return root


def _verdicts(root):
    col = collect([root])
    return {v.control.name: v for v in controls.evaluate([controls.Control.parse(c) for c in SPEC], col.runs,
                                                          col.metrics, col.configs)}


def test_verdicts_follow_the_measured_effects(tmp_path):
    v = _verdicts(_sweep(tmp_path / "sweep"))
    assert v["clip-higher"].verdict == "reproduced" and v["clip-higher"].delta == pytest.approx(0.2, abs=0.02)
    assert v["clip-higher"].acts_value == pytest.approx(0.3, abs=0.02) and v["clip-higher"].arms_n == (4,)
    assert v["overlong"].verdict == "not testable"  # truncated 0 +- noise at step 1: under the 0.1 floor
    assert v["ratio"].verdict == "reproduced"  # both gspo (0.3) and cispo (0.1) differ from grpo (0.02)
    ps = [v[n].p for n in ("clip-higher", "overlong", "ratio")]
    assert sorted(v[n].p_holm for n in v) == pytest.approx(sorted(controls.holm(ps)))
    row = v["clip-higher"].row()
    assert len(row) == len(controls.COLUMNS) and row[-1] == "reproduced" and "yes" in row[1]


def test_an_effect_that_does_not_show_is_not_reproduced(tmp_path):
    v = _verdicts(_sweep(tmp_path / "sweep", entropy_gain=-0.2, truncated=0.3, cispo_clip=0.02))
    assert v["clip-higher"].verdict == "not reproduced"  # the clip bound (0.3 clipped) but entropy fell: wrong way
    assert v["overlong"].verdict == "not reproduced"  # acted (0.3 truncated) with no difference between the arms
    assert v["ratio"].verdict == "not reproduced"  # cispo equals grpo: not every objective differs
    assert v["ratio"].p > 0.05


def test_a_malformed_prediction_names_the_control_and_field():
    bad = {**SPEC[0], "predict": {**SPEC[0]["predict"], "window": "late"}}
    with pytest.raises(controls.ControlsError, match=r"control 'clip-higher': predict.window='late'"):
        controls.Control.parse(bad)
    with pytest.raises(controls.ControlsError, match="no 'acts'"):
        controls.Control.parse({k: v for k, v in SPEC[0].items() if k != "acts"})


def test_the_shipped_preset_states_every_control_before_its_run():
    spec = controls.read_controls(ROOT / "sweeps" / "controls.yaml")
    assert [c.name.split(" (")[0] for c in spec] == ["clip-higher", "length bias", "overlong shaping", "critic warm-up",
                                                      "ratio objectives"]
    assert all(c.mechanism and c.acts.get("min") is not None for c in spec)


def test_report_prints_and_writes_the_verdicts(tmp_path):
    import io

    from rich.console import Console

    from analysis import report

    sweep = _sweep(tmp_path / "sweep")
    preset = tmp_path / "p.yaml"
    preset.write_text(yaml.safe_dump({"description": "x", "verdicts": SPEC}))
    buf = io.StringIO()
    rc = report.main([str(sweep), "--controls", str(preset), "--out", str(tmp_path / "out")],
                     console=Console(file=buf, width=250))
    assert rc == 0
    header = "| control | mechanism acts (diagnostic, value) | prediction | Δ [95% CI] | p (Holm) | verdict |"
    assert header in buf.getvalue()
    assert (tmp_path / "out" / "controls.md").read_text().count("| reproduced |") == 2
    assert "## Positive controls" in (tmp_path / "out" / "report.md").read_text()
    for name in ("clip_higher", "overlong", "ratio"):
        assert (tmp_path / "out" / "plots" / f"control_{name}.png").exists()
    rc = report.main([str(sweep), "--controls", "no_such_preset", "--out", str(tmp_path / "out2"), "--no-plots"],
                     console=Console(file=io.StringIO()))
    assert rc == 2
