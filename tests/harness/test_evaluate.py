"""harness eval: accuracy, unbiased pass@k, per-subject breakdown, run directory."""

import json

import pytest

from harness.cli import main
from harness.evaluate import summarise


def test_summarise_by_hand():
    out = summarise([[True, False, False, False], [True, True, False, False], [False] * 4], "eval/x")
    assert out["eval/x/accuracy"] == pytest.approx(3 / 12)
    assert out["eval/x/pass@1"] == pytest.approx((1 / 4 + 2 / 4 + 0) / 3)
    # pass@2 for n=4: c=1 -> 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5 ; c=2 -> 1 - C(2,2)/C(4,2) = 5/6
    assert out["eval/x/pass@2"] == pytest.approx((0.5 + 5 / 6 + 0) / 3)
    assert out["eval/x/pass@4"] == pytest.approx(2 / 3)


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
