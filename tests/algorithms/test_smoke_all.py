"""A 2-step end-to-end run of every built-in algorithm on the tiny model."""

import json

import pytest

from harness.commands.cli import main
from harness.commands.docs_gen import builtin_algorithms

ALGOS = sorted(builtin_algorithms())


@pytest.mark.parametrize("name", ALGOS)
def test_two_step_run(name, tmp_path, fast_run):
    run_dir = tmp_path / "run"
    # teacher.sft_steps: opd's tiny teacher, trained 10 steps here, not 2000 (the others ignore it)
    main(["run", *fast_run, "trainer.steps=2", f"algo={name}", "teacher.sft_steps=10", f"run_dir={run_dir}"])
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and info["steps_done"] == 2 and info["algo"] == name
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for key in ("loss/policy", "policy/clipfrac", "policy/approx_kl", "reward/mean"):
        assert key in rows[1], key
    if name == "dapo":
        assert "dapo/sampling_rounds" in rows[1] and "dapo/kept_group_frac" in rows[1]
