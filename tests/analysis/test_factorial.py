"""Main effects of factorial designs (analysis/factorial.py): hand-computed numbers, known effects recovered,
the interaction test, notes for designs that are not full, and `harness report`'s table."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pandas as pd
import pytest
from fake_runs import make_run
from rich.console import Console
from scipy import stats

from analysis import report
from analysis.factorial import analyse, detect_factors


def _design(cells: dict[tuple[str, str], list[float]]) -> tuple[pd.DataFrame, dict]:
    """Runs of factors A x B: {(a, b): [final accuracy per seed]} -> (runs, configs)."""
    rows, configs = [], {}
    for (a, b), ys in cells.items():
        for i, y in enumerate(ys):
            d = f"A={a},B={b},seed={i}"
            rows.append({"run_dir": d, "eval_final": y})
            configs[d] = {"algo.name": a, "trainer.lr": b, "seed": i, "run_dir": d}
    return pd.DataFrame(rows), configs


def test_a_two_by_two_design_matches_the_hand_computed_effects_and_f_test():
    """Cell means 2, 5 (A=a1), 3 (B=b1), 9 (both), two runs each 1 apart: pooled variance 2 on 4 df.
    A: ((5-2) + (9-3)) / 2 = 4.5, SE^2 = 2/4 * (1/2+1/2) * 2 = 1; B: ((3-2) + (9-5)) / 2 = 2.5, SE 1.
    The additive model misses each cell mean by 0.75: RSS 8 + 2*4*0.5625 = 12.5, F(1, 4) = 4.5 / 2 = 2.25."""
    runs, configs = _design({("a0", "b0"): [1, 3], ("a1", "b0"): [4, 6], ("a0", "b1"): [2, 4], ("a1", "b1"): [8, 10]})
    fa = analyse("t", runs, configs, ["algo.name", "trainer.lr"])
    assert not fa.note and fa.residual_df == 4 and fa.cell_runs == (2, 2)
    a, b = fa.effects
    assert (a.factor, a.level, a.reference, b.factor, b.level) == ("algo.name", "a1", "a0", "trainer.lr", "b1")
    assert a.effect == pytest.approx(4.5) and b.effect == pytest.approx(2.5)
    assert a.p == pytest.approx(2 * stats.t.sf(4.5, 4)) and b.p == pytest.approx(2 * stats.t.sf(2.5, 4))
    t = stats.t.ppf(0.975, 4)
    assert a.ci == pytest.approx((4.5 - t, 4.5 + t))
    assert a.p_holm == pytest.approx(2 * a.p) and b.p_holm == pytest.approx(max(b.p, 2 * a.p))
    f_stat, p, df1, df2 = fa.interaction
    assert (f_stat, df1, df2) == (pytest.approx(2.25), 1, 4) and p == pytest.approx(stats.f.sf(2.25, 1, 4))


def _known(interaction: float = 0.0) -> tuple[pd.DataFrame, dict]:
    """3 x 3 levels, 5 seeds, noise sd 0.01: A's levels add 0, +0.05, -0.03; B's 0, 0, +0.08; with
    ``interaction`` added to the one cell (a2, b2)."""
    rng = np.random.default_rng(0)
    a_eff, b_eff = {"a0": 0.0, "a1": 0.05, "a2": -0.03}, {"b0": 0.0, "b1": 0.0, "b2": 0.08}
    cells = {(a, b): list(0.4 + a_eff[a] + b_eff[b] + (interaction if (a, b) == ("a2", "b2") else 0)
                          + rng.normal(0, 0.01, 5))
             for a, b in itertools.product(a_eff, b_eff)}  # fmt: skip
    return _design(cells)


def test_known_main_effects_are_recovered_with_holm_p():
    fa = analyse("t", *_known(), ["algo.name", "trainer.lr"])
    got = {(e.factor, e.level): e for e in fa.effects}
    for key, true in {("algo.name", "a1"): 0.05, ("algo.name", "a2"): -0.03, ("trainer.lr", "b1"): 0.0,
                      ("trainer.lr", "b2"): 0.08}.items():  # fmt: skip
        e = got[key]
        assert e.effect == pytest.approx(true, abs=0.008) and e.ci[0] < true < e.ci[1] and e.n_cells == 3
        assert (e.p_holm < 0.001) if true else (e.p_holm > 0.05)
    assert fa.interaction[1] > 0.05  # an additive design: no interaction found


def test_an_interaction_is_found_and_averaged_into_the_main_effect():
    """+0.09 in one of three cells moves A's and B's a2/b2 main effects by 0.03 and fails the additive model."""
    fa = analyse("t", *_known(interaction=0.09), ["algo.name", "trainer.lr"])
    got = {(e.factor, e.level): e.effect for e in fa.effects}
    assert got[("algo.name", "a2")] == pytest.approx(-0.03 + 0.03, abs=0.008)
    assert got[("trainer.lr", "b2")] == pytest.approx(0.08 + 0.03, abs=0.008)
    assert fa.interaction[1] < 1e-6


def test_a_reference_level_can_be_chosen():
    fa = analyse("t", *_known(), ["algo.name", "trainer.lr"], references={"algo.name": "a1"})
    got = {(e.factor, e.level): e.effect for e in fa.effects if e.factor == "algo.name"}
    assert set(got) == {("algo.name", "a0"), ("algo.name", "a2")}
    assert got[("algo.name", "a0")] == pytest.approx(-0.05, abs=0.008)


@pytest.mark.parametrize("drop, seeds, why", [
    (("a0", "b1"), 5, "not a full factorial: 1 of 9 cells have no runs (algo.name=a0 trainer.lr=b1)"),
    (None, 1, "one run per cell"),
])  # fmt: skip
def test_a_design_that_is_not_full_gets_a_note_not_numbers(drop, seeds, why):
    runs, configs = _known()
    keep = [d for d in runs["run_dir"] if int(d.rsplit("=", 1)[1]) < seeds
            and (drop is None or not d.startswith(f"A={drop[0]},B={drop[1]},"))]  # fmt: skip
    fa = analyse("t", runs[runs["run_dir"].isin(keep)], configs, ["algo.name", "trainer.lr"])
    assert why in fa.note and not fa.effects
    # found by itself (no factors named), a design that is not full is no factorial at all: no note
    assert analyse("t", runs[runs["run_dir"].isin(keep)], configs) is None


def test_a_single_level_and_an_unset_key_are_named():
    runs, configs = _known()
    a0 = runs[runs["run_dir"].str.startswith("A=a0,")]
    assert "algo.name has a single level" in analyse("t", a0, configs, ["algo.name", "trainer.lr"]).note
    assert "not every run sets algo.epochs" in analyse("t", runs, configs, ["algo.name", "algo.epochs"]).note


def test_factors_are_the_varying_keys_less_those_another_determines():
    """algo.clip_high follows the algorithm (DAPO's default): not a factor; algo.alias renames algo.name
    one to one: the shorter name stays; seed and run_dir never count."""
    configs = [{"algo.name": a, "algo.alias": a.upper(), "algo.clip_high": 0.28 if a == "dapo" else 0.2,
                "trainer.lr": lr, "seed": s, "run_dir": f"{a}{lr}{s}", "runtime.threads": 1}
               for a in ("grpo", "dapo", "rloo") for lr in (1e-4, 3e-4) for s in (0, 1)]  # fmt: skip
    assert detect_factors(configs) == ["algo.name", "trainer.lr"]


def _lr_sweep(root, lrs=(1e-4, 3e-4), algos=("grpo", "rloo"), seeds=(0, 1, 2)):
    """final accuracy 0.3, +0.1 for rloo, +0.05 at lr 3e-4, seeds 0.01 apart."""
    for algo, lr, s in itertools.product(algos, lrs, seeds):
        make_run(root, algo=algo, seed=s, name=f"{algo}-{lr}-{s}", trainer={"lr": lr},
                 final_acc=0.3 + 0.1 * (algo == "rloo") + 0.05 * (lr == 3e-4) + 0.01 * (s - 1))
    return root


def test_report_finds_the_factorial_and_writes_main_effects(tmp_path):
    sweep = _lr_sweep(tmp_path / "sweep")
    out, buf = tmp_path / "out", io.StringIO()
    rc = report.main([str(sweep), "--out", str(out), "--no-plots", "--reference", "algo.name=grpo"],
                     console=Console(file=buf, width=250))
    assert rc == 0, buf.getvalue()
    effects = pd.read_csv(out / "main_effects.csv").set_index("level")
    assert effects.loc["rloo", "effect"] == pytest.approx(0.1) and effects.loc["rloo", "reference"] == "grpo"
    assert effects.loc["0.0003", "effect"] == pytest.approx(0.05) and effects.loc["0.0003", "factor"] == "trainer.lr"
    assert (effects["p_holm"] < 0.001).all()
    md = (out / "report.md").read_text()
    assert "## Main effects (factorial design)" in md and "**algo.name**: matters: rloo +0.100" in md
    assert "Main effects" in buf.getvalue()


def test_report_says_when_named_factors_do_not_cross(tmp_path):
    sweep = _lr_sweep(tmp_path / "sweep", algos=("grpo",))
    make_run(sweep, algo="rloo", seed=0, name="rloo-only", trainer={"lr": 1e-4})
    buf = io.StringIO()
    rc = report.main([str(sweep), "--out", str(tmp_path / "out"), "--no-plots", "--factors", "algo.name,trainer.lr"],
                     console=Console(file=buf, width=250))
    assert rc == 0 and "not a full factorial: 1 of 4 cells have no runs (algo.name=rloo trainer.lr=0.0003)" in buf.getvalue()
    assert not (tmp_path / "out" / "main_effects.csv").exists()
    # an ordinary sweep (two algorithms, nothing crossed) prints no factorial section
    buf = io.StringIO()
    assert report.main([str(_lr_sweep(tmp_path / "plain", lrs=(1e-4,))), "--no-plots"], console=Console(file=buf)) == 0
    assert "Main effects" not in buf.getvalue()


@pytest.mark.parametrize("args, why", [
    (["--factors", "algo.name"], "name two or more config keys"),
    (["--reference", "algo.name"], "write KEY=VALUE"),
    (["--factors", "algo.name,trainer.lr", "--reference", "algo.epochs=2"], "not among --factors"),
])  # fmt: skip
def test_bad_factor_arguments_are_named(tmp_path, args, why):
    buf = io.StringIO()
    rc = report.main([str(_lr_sweep(tmp_path / "s", seeds=(0,))), "--no-plots", *args], console=Console(file=buf, width=250))
    assert rc == 2 and why in buf.getvalue()
