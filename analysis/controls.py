"""Positive controls: per mechanism an algorithm claims, a regime where it acts, a prediction stated before
the run, and a verdict (docs/controls.md; the preset ``sweeps/controls.yaml`` holds both the arms and, under
``verdicts``, what each control predicts; ``harness report DIR --controls controls`` applies them).

A control names its arms by config values (``{algo.name: dapo, algo.clip_high: 0.28}``: every run whose
config.yaml has them), a diagnostic that shows the mechanism acted (``acts``: a metric, a window, a floor),
and a prediction (``predict``: a metric, a window, a direction). The verdict:

- "not testable": the diagnostic stayed below its floor (the mechanism had nothing to act on);
- "reproduced": the arm differs from ``versus`` in the predicted direction, Holm p < 0.05 over the controls;
- "not reproduced": the mechanism acted and the predicted difference did not appear.

Windows turn a run's metrics into one number per run (seeds are the unit of the test):
``first`` the first RL step, ``last_quarter`` the mean over the last quarter of the steps, ``all`` the mean
over every step, ``growth`` last quarter minus first quarter, ``drop`` the fall from the first quarter to the
last relative to the first, ``final_eval`` the run's last eval accuracy.
A control with several arms (``arm: [...]``) predicts that each differs: its p is the largest of theirs
(all must differ; an intersection-union test).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from analysis.stats import ALPHA, holm, welch

WINDOWS = ("first", "last_quarter", "all", "growth", "drop", "final_eval")
DIRECTIONS = ("higher", "lower", "differs")
COLUMNS = ["control", "mechanism acts (diagnostic, value)", "prediction", "Δ [95% CI]", "p (Holm)", "verdict"]


class ControlsError(ValueError):
    """A malformed ``verdicts`` entry (the message names the control and the field)."""


@dataclass
class Control:
    name: str
    mechanism: str
    arms: list[dict[str, Any]]  # each: config values that pick the arm's runs
    versus: dict[str, Any]
    acts: dict[str, Any]  # metric, window, min, of ('arm' | 'versus' | 'both'), label
    predict: dict[str, Any]  # metric, window, direction, label

    @classmethod
    def parse(cls, raw: dict) -> Control:
        name = raw.get("control") or "?"
        for key in ("control", "mechanism", "arm", "versus", "acts", "predict"):
            if key not in raw:
                raise ControlsError(f"control {name!r}: no {key!r}")
        arms = raw["arm"] if isinstance(raw["arm"], list) else [raw["arm"]]
        for part, spec in (("acts", raw["acts"]), ("predict", raw["predict"])):
            if spec.get("window") not in WINDOWS:
                raise ControlsError(f"control {name!r}: {part}.window={spec.get('window')!r}; use {', '.join(WINDOWS)}")
            if "metric" not in spec and spec["window"] != "final_eval":
                raise ControlsError(f"control {name!r}: {part}.metric missing")
        if raw["predict"].get("direction") not in DIRECTIONS:
            raise ControlsError(f"control {name!r}: predict.direction={raw['predict'].get('direction')!r}; "
                                f"use {', '.join(DIRECTIONS)}")
        return cls(name, raw["mechanism"], arms, raw["versus"], raw["acts"], raw["predict"])


def resolve(name_or_path: str) -> Path:
    """A preset file: a path, or a name in ./sweeps or the checkout's sweeps/ (as ``harness sweep --preset``)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise ControlsError(f"{p} does not exist")
        return p
    for d in (Path.cwd() / "sweeps", Path(__file__).resolve().parents[1] / "sweeps"):
        if (d / f"{name_or_path}.yaml").exists():
            return d / f"{name_or_path}.yaml"
    raise ControlsError(f"no preset {name_or_path!r} in ./sweeps or the checkout's sweeps/")


def read_controls(preset: str | Path) -> list[Control]:
    data = yaml.safe_load(Path(preset).read_text()) or {}
    raw = data.get("verdicts") or []
    if not raw:
        raise ControlsError(f"preset {preset}: no 'verdicts' (the controls' predictions)")
    return [Control.parse(r) for r in raw]


def _matches(config: dict[str, Any], want: dict[str, Any]) -> bool:
    def same(a, b) -> bool:
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
        return a == b

    return all(k in config and same(config[k], v) for k, v in want.items())


def arm_runs(runs: pd.DataFrame, configs: dict[str, dict], want: dict[str, Any]) -> pd.DataFrame:
    """The runs whose flat config holds every ``want`` value."""
    return runs[[_matches(configs[d], want) for d in runs["run_dir"]]]


def per_run(runs: pd.DataFrame, metrics: pd.DataFrame, metric: str | None, window: str) -> np.ndarray:
    """One number per run of ``runs``: ``metric`` over ``window`` of its training steps (see module doc)."""
    out = []
    for _, r in runs.iterrows():
        if window == "final_eval":
            out.append(float(r["eval_final"]))
            continue
        m = metrics[(metrics["run_dir"] == r["run_dir"]) & (metrics["step"] > 0)].sort_values("step")
        v = m[metric].to_numpy(float) if metric in m else np.array([])
        v = v[~np.isnan(v)]
        if len(v) == 0:
            out.append(float("nan"))
            continue
        q = max(1, len(v) // 4)
        first_q, last_q = v[:q].mean(), v[-q:].mean()
        drop = (first_q - last_q) / abs(first_q) if first_q else float("nan")
        out.append(float({"first": v[0], "last_quarter": last_q, "all": v.mean(), "growth": last_q - first_q,
                          "drop": drop}[window]))
    return np.asarray(out, float)


def _window_text(metric: str | None, window: str) -> str:
    return {"first": f"{metric} at step 1", "last_quarter": f"{metric}, last quarter of training",
            "all": f"{metric}, mean over training", "growth": f"{metric}, last quarter minus first",
            "drop": f"{metric}, relative fall from the first quarter to the last",
            "final_eval": "final eval accuracy"}[window]


@dataclass
class Verdict:
    control: Control
    acts_value: float
    acts_ok: bool
    delta: float
    ci: tuple[float, float]
    p: float
    p_holm: float = float("nan")
    right_way: bool = False  # every arm's difference in the predicted direction
    verdict: str = ""
    arms_n: tuple[int, ...] = ()
    versus_n: int = 0
    arm_values: list[np.ndarray] | None = None
    versus_values: np.ndarray | None = None

    def row(self) -> list[str]:
        c = self.control
        acts = c.acts
        floor = f">= {acts['min']:g}" if "min" in acts else ""
        diag = (f"{acts.get('label') or _window_text(acts.get('metric'), acts['window'])}: "
                f"{_fmt(self.acts_value)} ({floor}: {'yes' if self.acts_ok else 'no'})")
        pred = c.predict
        arms = " / ".join(_label(a) for a in c.arms)
        what = pred.get("label") or _window_text(pred.get("metric"), pred["window"])
        pred_text = (f"{what}: each of {arms} differs from {_label(c.versus)}" if pred["direction"] == "differs" else
                     f"{what} {pred['direction']} under {arms} than under {_label(c.versus)}")
        ci = "" if math.isnan(self.ci[0]) else f" [{self.ci[0]:+.3g}, {self.ci[1]:+.3g}]"
        delta = "-" if math.isnan(self.delta) else f"{self.delta:+.3g}{ci}"
        p = "-" if math.isnan(self.p) else f"{self.p:.2g} ({self.p_holm:.2g})"
        n = f" (n {'/'.join(map(str, self.arms_n))} vs {self.versus_n})"
        return [c.name, diag, pred_text, delta + n, p, self.verdict]


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3g}"


def _label(want: dict[str, Any]) -> str:
    return ", ".join(str(v) if k == "algo.name" else f"{k}={v}" for k, v in want.items())


def evaluate(controls: list[Control], runs: pd.DataFrame, metrics: pd.DataFrame,
             configs: dict[str, dict]) -> list[Verdict]:
    """The verdict of each control over the collected runs (analysis.collect), Holm over the controls."""
    out = []
    for c in controls:
        base = arm_runs(runs, configs, c.versus)
        arms = [arm_runs(runs, configs, a) for a in c.arms]
        on = {"arm": pd.concat(arms), "versus": base, "both": pd.concat([*arms, base])}[c.acts.get("of", "both")]
        acts_vals = per_run(on, metrics, c.acts.get("metric"), c.acts["window"])
        acts_value = float(np.nanmean(acts_vals)) if len(acts_vals) and not np.isnan(acts_vals).all() else float("nan")
        acts_ok = not math.isnan(acts_value) and acts_value >= float(c.acts.get("min", -math.inf))
        b = per_run(base, metrics, c.predict.get("metric"), c.predict["window"])
        tests, deltas, values = [], [], []
        for a in arms:
            v = per_run(a, metrics, c.predict.get("metric"), c.predict["window"])
            values.append(v)
            p, lo, hi = welch(v, b)
            d = float(np.nanmean(v) - np.nanmean(b)) if len(v) and len(b) else float("nan")
            tests.append((p, lo, hi, d))
            deltas.append(d)
        direction = c.predict["direction"]
        right_way = all(not math.isnan(d) and (d > 0 if direction == "higher" else d < 0 if direction == "lower" else d != 0)
                        for d in deltas)  # fmt: skip
        worst = max(tests, key=lambda t: (math.isnan(t[0]), t[0]))  # the largest p (all arms must differ)
        p, lo, hi, d = worst
        out.append(Verdict(c, acts_value, acts_ok, d, (lo, hi), p, right_way=right_way, arms_n=tuple(len(a) for a in arms),
                           versus_n=len(base), arm_values=values, versus_values=b))
    adjusted = holm([v.p for v in out])
    for v, ph in zip(out, adjusted):
        v.p_holm = float(ph)
        if not v.versus_n or not all(v.arms_n):
            v.verdict = "no runs"  # an arm missing from these run directories: nothing was measured
        elif not v.acts_ok:
            v.verdict = "not testable"
        elif v.right_way and not math.isnan(ph) and ph < ALPHA:
            v.verdict = "reproduced"
        else:
            v.verdict = "not reproduced"
    return out


def markdown(verdicts: list[Verdict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in v.row()) + " |" for v in verdicts]
    n = sum(v.verdict == "reproduced" for v in verdicts)
    lines += ["", f"{n} of {len(verdicts)} reproduced. Δ: mean of the arm minus the mean of the reference over seeds "
              f"(the largest-p arm where a control has several); Welch's two-sided t-test, 95% CI; p Holm-corrected over "
              f"the {len(verdicts)} controls; n: runs per arm."]
    return "\n".join(lines)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower().split("(")[0]).strip("_")


def plot(verdicts: list[Verdict], runs: pd.DataFrame, metrics: pd.DataFrame, configs: dict[str, dict],
         out_dir: str | Path) -> list[Path]:
    """plots/control_<name>.png|pdf: the predicted metric (or eval accuracy) against the RL step, each arm's mean
    over seeds with a 95% band (the step, not the tokens: seeds of one arm spend their tokens at other steps)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from analysis.plots import _save

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for v in verdicts:
        c = v.control
        metric = c.predict.get("metric") if c.predict["window"] != "final_eval" else "eval_acc"
        frames = []
        sides = [*c.arms, c.versus]
        shared = {k for k in sides[0] if all(k in w and w[k] == sides[0][k] for w in sides)} - {"algo.name"}
        for want in sides:
            ids = set(arm_runs(runs, configs, want)["run_dir"])
            m = metrics[metrics["run_dir"].isin(ids)]
            if metric not in m:
                continue
            m = m[m[metric].notna()] if metric != "eval_acc" else m[m["eval_acc"].notna()]
            label = _label({k: v for k, v in want.items() if k not in shared})  # what tells the arms apart
            frames.append(m.assign(arm=label)[["arm", "step", metric]])
        if not frames:
            continue
        data = pd.concat(frames, ignore_index=True)
        fig, ax = plt.subplots(figsize=(6.5, 4))
        sns.lineplot(data=data, x="step", y=metric, hue="arm", errorbar=("ci", 95), ax=ax, estimator="mean",
                     n_boot=1000, seed=0, marker="o")
        ax.set(xlabel="RL step (every arm: the same token budget)", ylabel=metric, title=f"{c.name}: {v.verdict}")
        ax.legend(fontsize=7)
        paths += _save(fig, out, f"control_{slug(c.name)}")
    return paths
