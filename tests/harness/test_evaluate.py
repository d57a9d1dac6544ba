"""harness eval: accuracy, unbiased pass@k, per-subject breakdown, run directory."""

import json

import pytest

from harness.commands.cli import main
from harness.commands.evaluate import summarise


def test_summarise_by_hand():
    out = summarise([[True, False, False, False], [True, True, False, False], [False] * 4], "eval/x")
    assert out["eval/x/accuracy"] == pytest.approx(3 / 12)
    assert out["eval/x/pass@1"] == pytest.approx((1 / 4 + 2 / 4 + 0) / 3)
    # pass@2 for n=4: c=1 -> 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5 ; c=2 -> 1 - C(2,2)/C(4,2) = 5/6
    assert out["eval/x/pass@2"] == pytest.approx((0.5 + 5 / 6 + 0) / 3)
    assert out["eval/x/pass@4"] == pytest.approx(2 / 3)


def test_majority_vote_by_hand():
    from harness.commands.evaluate import majority_correct

    assert majority_correct(["5", "5", "3"], [True, True, False]) is True
    assert majority_correct(["3", "5", "5", "3"], [False, True, True, False]) is False  # tie 2-2: "3" came first
    assert majority_correct(["5", "3", "3", "5"], [True, False, False, True]) is True  # tie 2-2: "5" came first
    assert majority_correct([None, "", " "], [False, False, False]) is False  # nothing extracted
    assert majority_correct([None, None, "7"], [False, False, True]) is True  # one vote is a majority of voters
    assert majority_correct([" 4", "4 ", "9", "9", "9"], [True, True, False, False, False]) is False
    assert majority_correct(["5", "5", "3"], [False, True, False]) is True  # the first check timed out, the second held


def test_maj_at_k_and_intervals_by_hand():
    """maj@4 over 3 prompts, the Wilson interval from its formula, a bootstrap interval around mean@4."""
    correct = [[True, True, False, False], [False, False, False, True], [True, True, True, False]]
    answers = [["4", "4", "5", "6"], ["1", "2", "2", "3"], ["8", "8", "8", "9"]]
    out = summarise(correct, "eval/x", answers)
    assert out["eval/x/maj@4"] == pytest.approx(2 / 3)  # "4" right, "2" wrong, "8" right
    # Wilson's score interval, z = 1.959964: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    z, n, p = 1.959963984540054, 3, 2 / 3
    centre, half = p + z * z / (2 * n), z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
    assert out["eval/x/maj@4_ci_low"] == pytest.approx((centre - half) / (1 + z * z / n))
    assert out["eval/x/maj@4_ci_high"] == pytest.approx((centre + half) / (1 + z * z / n))
    assert (centre - half) / (1 + z * z / n) == pytest.approx(0.2077, abs=1e-4)  # the textbook value for 2 of 3
    # mean@4 per prompt: 0.5, 0.25, 0.75 -> a bootstrap over prompts, inside [0.25, 0.75], around 0.5
    assert out["eval/x/accuracy"] == pytest.approx(0.5)
    assert 0.25 <= out["eval/x/accuracy_ci_low"] < 0.5 < out["eval/x/accuracy_ci_high"] <= 0.75
    assert summarise(correct, "eval/x", answers) == out  # seeded: the same interval every time
    same = summarise([[True, False]] * 5, "eval/y")  # every prompt 0.5: nothing to resample
    assert same["eval/y/accuracy_ci_low"] == same["eval/y/accuracy_ci_high"] == 0.5
    greedy = summarise([[True], [False], [True], [True]], "eval/g", [["1"], ["2"], ["3"], ["4"]])
    assert "eval/g/maj@1" not in greedy and greedy["eval/g/accuracy_ci_low"] == pytest.approx(0.3006, abs=1e-4)


def test_verdict_outcomes_and_their_fractions():
    from harness.scoring import outcome_metrics
    from rewards.registry import Verdict

    verdicts = [Verdict(1.0, True, "4", "match"), Verdict(0.0, False, "5", "mismatch"),
                Verdict(0.0, False, None, "no_answer:strict"), Verdict(0.0, False, "3 or 4", "hedged:boxed:x"),
                Verdict(0.0, False, None, "timeout"), Verdict(0.0, False, None, "error:ValueError"),
                Verdict(0.0, False, None, "bad_ground_truth"), Verdict(0.0, False, "x", "no_number:strict:y")]
    assert [v.outcome for v in verdicts] == ["correct", "wrong", "no_answer", "no_answer", "timeout", "error",
                                             "error", "no_answer"]
    assert outcome_metrics(verdicts, "reward") == {"reward/no_answer_frac": 3 / 8, "reward/timeout_frac": 1 / 8,
                                                   "reward/error_frac": 2 / 8}


def test_eval_writes_a_run_dir_with_breakdowns(tmp_path, shared_data, fast_run):
    # Build (or reuse) the tiny arith model via a 1-step run, then evaluate it on MATH-500.
    train_dir = tmp_path / "train"
    main(["run", *fast_run, "trainer.steps=1", f"run_dir={train_dir}"])
    cache_model = json.loads((train_dir / "run.json").read_text())["model_path"]
    out = tmp_path / "eval"
    main(["eval", "task=math500", f"task.source={shared_data}/math", f"model.path={cache_model}", "samples=2",
          "eval_limit=6", "rollout.max_response_tokens=4", f"run_dir={out}"])
    info = json.loads((out / "run.json").read_text())
    assert info["status"] == "finished" and info["kind"] == "eval" and info["checker"] == "math@2"
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["eval/math500/prompts"] == 6
    assert metrics["eval/math500/pass@2"] >= metrics["eval/math500/pass@1"]
    assert any(k.startswith("eval/math500/subject=") for k in metrics)
    assert any(k.startswith("eval/math500/level=") for k in metrics)
    assert len((out / "samples.jsonl").read_text().splitlines()) == 12
    # the no-answer fraction counts the samples the checker found no answer in
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    no_answer = sum(s["reason"].startswith(("no_answer", "no_number", "hedged")) for s in samples) / 12
    assert metrics["eval/math500/no_answer_frac"] == pytest.approx(no_answer)
    assert metrics["eval/math500/timeout_frac"] == 0 and metrics["eval/math500/error_frac"] == 0


@pytest.mark.integration
def test_offline_eval_of_a_checkpoint_reproduces_the_in_training_eval(tmp_path):
    """Each checkpoint holds the policy as a Hugging Face directory; `harness eval` of it gives the
    greedy accuracy the run logged at that step, exactly (one generate-and-score path)."""
    run_dir = tmp_path / "run"
    main(["run", "algo=grpo", "trainer.steps=4", "trainer.eval_every=2", "trainer.checkpoint_every=2",
          "trainer.prompts_per_step=16", "trainer.lr=2e-3", "task.eval_prompts=96", f"run_dir={run_dir}"])
    logged = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if "eval/arith/accuracy" in r}
    assert sorted(logged) == [0, 2, 4]
    for step in (2, 4):
        policy = run_dir / "checkpoints" / f"step_{step:07d}" / "policy"
        assert (policy / "model.safetensors").exists() and (policy / "config.json").exists()
        assert (policy / "tokenizer.json").exists()
        out = tmp_path / f"eval{step}"
        main(["eval", f"model.path={policy}", "eval_limit=96", f"run_dir={out}"])
        offline = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        assert offline["eval/arith/accuracy"] == logged[step]["eval/arith/accuracy"]
        info = json.loads((out / "run.json").read_text())
        assert len(info["model_info"]["weights_sha256"]) == 64
    # the run dir itself (no model.path): its step-2 checkpoint, on the run's own task settings
    main(["eval", str(run_dir), "--checkpoint", "2", f"run_dir={tmp_path / 'eval_run_dir'}"])
    offline = json.loads((tmp_path / "eval_run_dir" / "metrics.jsonl").read_text().splitlines()[0])
    assert offline["eval/arith/prompts"] == 96  # task.eval_prompts=96 came from the run's config.yaml
    assert offline["eval/arith/accuracy"] == logged[2]["eval/arith/accuracy"]
    # the policy moved (a test of equality between two unchanged models would prove nothing)
    assert logged[4]["eval/arith/response_tokens_mean"] != logged[0]["eval/arith/response_tokens_mean"] or \
        logged[4]["eval/arith/accuracy"] != logged[0]["eval/arith/accuracy"]
