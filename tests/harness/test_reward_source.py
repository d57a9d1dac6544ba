"""Reward sources: a reward model served by the runtime as the training reward (or mixed with
the checker), the checker still scoring every rollout as gold, and bad settings refused."""

import json
from pathlib import Path

import pytest
import torch

from harness.commands.cli import main

pytestmark = pytest.mark.integration

RM = ["reward.model_path=tiny", "rm.steps=20", "rm.eval_every=10", "rm.pairs_per_step=8"]  # a quick, weak one


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_role_built_from_the_export_scores_as_the_hf_classifier(tmp_path):
    """The worker's reward-model role reads the export's trained head: for a response that
    stopped (EOS) and one cut at the length cap (an EOS is appended to score it) it gives what
    AutoModelForSequenceClassification gives for the text without the EOS."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from algorithms import Batch
    from harness.runtime.train.fsdp import TrainEngine, init_distributed
    from harness.runtime.workers.worker import build_role_model
    from harness.scoring import ended, last_token_values, reward_model_role

    main(["rm", "train", "rm.steps=20", "rm.eval_every=10", "runtime.threads=1", f"run_dir={tmp_path / 'rm'}"])
    export = str(tmp_path / "rm" / "reward_model")
    init_distributed("cpu")
    engine = TrainEngine(build_role_model(reward_model_role(export), "unused", "float32", False), "cpu", "fp32")
    classifier = AutoModelForSequenceClassification.from_pretrained(export).eval()
    eos = AutoTokenizer.from_pretrained(export).eos_token_id
    prompt = torch.tensor([[1, 2, 3, 4]])  # the tiny tokenizer has 14 tokens
    responses = torch.tensor([[5, 6, 7, eos], [8, 9, 10, 11]])  # stopped after 3 tokens; cut at 4
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    batch = Batch(prompt_ids=prompt.repeat(2, 1), prompt_mask=torch.ones(2, 4, dtype=torch.bool),
                  response_ids=responses, response_mask=mask, group_ids=torch.tensor([0, 0]), prompts=["", ""],
                  responses=["", ""], ground_truths=["", ""], truncated=torch.tensor([False, True]))  # fmt: skip
    scored = ended(batch, eos)
    assert scored.response_ids[1].tolist() == [8, 9, 10, 11, eos] and scored.response_mask[0].tolist()[-1] is False
    with torch.no_grad():
        values, _ = engine.forward(scored)
        ours = last_token_values(values, scored.response_mask)
        texts = [responses[0, :3], responses[1]]
        theirs = [float(classifier(input_ids=torch.cat([prompt[0], t])[None]).logits[0, 0]) for t in texts]
    assert float(classifier.score.weight.detach().abs().sum()) > 0  # a trained head, not the zero init
    assert ours.tolist() == pytest.approx(theirs, abs=1e-5)


def test_reward_model_is_the_training_reward_and_the_checker_the_gold(tmp_path, fast_run):
    run_dir = tmp_path / "rm_run"
    main(["run", *fast_run, "reward.source=model", *RM, f"run_dir={run_dir}"])
    rows = metrics(run_dir)[1:]
    for r in rows:
        assert r["reward/mean"] == pytest.approx(r["reward/model_mean"])  # trained on the model's score
        assert r["reward/gold_accuracy"] == r["reward/accuracy"]  # the checker's verdicts, logged as gold
        assert "reward/gold_mean" in r and r["kl/from_start"] >= -1e-6
    assert rows[0]["kl/from_start"] == pytest.approx(0.0, abs=1e-5)  # step 1 samples the starting policy
    assert any(r["kl/from_start"] > 1e-4 for r in rows[1:])  # then the policy moves away from it
    assert len({round(r["reward/model_mean"], 6) for r in rows}) > 1
    info = json.loads((run_dir / "run.json").read_text())
    assert info["reward"]["source"] == "model" and info["reward"]["model"]["path"] == "tiny"
    assert len(info["reward"]["model"]["weights_sha256"]) == 64 and info["status"] == "finished"


def test_mix_weights_model_and_checker(tmp_path, fast_run):
    run_dir = tmp_path / "mix"
    main(["run", *fast_run, "reward.source=mix", "reward.model_weight=0.25", *RM, f"run_dir={run_dir}"])
    for r in metrics(run_dir)[1:]:
        assert r["reward/mean"] == pytest.approx(0.25 * r["reward/model_mean"] + 0.75 * r["reward/gold_mean"], abs=1e-6)


def _batch(prompts: list[str], responses: list[str]):
    from algorithms import Batch

    n = len(responses)
    return Batch(prompt_ids=torch.ones(n, 1, dtype=torch.long), prompt_mask=torch.ones(n, 1, dtype=torch.bool),
                 response_ids=torch.ones(n, 1, dtype=torch.long), response_mask=torch.ones(n, 1, dtype=torch.bool),
                 group_ids=torch.zeros(n, dtype=torch.long), prompts=prompts, responses=responses,
                 ground_truths=["1"] * n, truncated=torch.zeros(n, dtype=torch.bool))  # fmt: skip


def test_random_rewards_have_the_rate_and_no_information():
    """reward.source=random: each response's reward is 1 with probability random_rate, drawn
    independently of its correctness; the draw is a function of the batch (a resumed run pays the
    same), identical responses in a group are drawn apart, and another seed draws other rewards."""
    from harness.scoring import random_rewards

    responses = [f"#### {i % 2}" for i in range(4000)]  # half right (ground truth 1), half wrong
    batch = _batch(["p"] * 4000, responses)
    scores = random_rewards(batch, 0.3, seed=0)
    assert set(scores.tolist()) == {0.0, 1.0}
    assert abs(float(scores.mean()) - 0.3) < 3 * (0.3 * 0.7 / 4000) ** 0.5  # 3 standard errors
    right = torch.tensor([r.endswith("1") for r in responses])
    assert abs(float(scores[right].mean() - scores[~right].mean())) < 0.05  # no more paid for right answers
    assert torch.equal(random_rewards(batch, 0.3, seed=0), scores)  # deterministic
    assert not torch.equal(random_rewards(batch, 0.3, seed=1), scores)  # the seed matters
    same = random_rewards(_batch(["p"] * 64, ["#### 1"] * 64), 0.5, seed=0)
    assert 0 < float(same.mean()) < 1  # one text 64 times: not one shared draw


def test_random_reward_control_trains_on_coin_flips(tmp_path, fast_run):
    """A run with reward.source=random: its training reward is the coin (reward/random_mean), the
    checker's accuracy is still logged as gold, and run.json records the rate."""
    main(["run", *fast_run, "reward.source=random", "reward.random_rate=0.25", f"run_dir={tmp_path}"])
    rows = metrics(tmp_path)[1:]
    for r in rows:
        assert r["reward/mean"] == pytest.approx(r["reward/random_mean"])
        assert r["reward/gold_accuracy"] == r["reward/accuracy"]
    assert any(r["reward/mean"] != r["reward/gold_mean"] for r in rows)
    assert json.loads((tmp_path / "run.json").read_text())["reward"] == {"source": "random", "random_rate": 0.25}


def test_checker_runs_log_no_proxy_metrics(tmp_path, fast_run):
    main(["run", *fast_run, f"run_dir={tmp_path}"])
    assert not any("reward/model_mean" in r or "kl/from_start" in r for r in metrics(tmp_path))
    assert json.loads((tmp_path / "run.json").read_text())["reward"] == {"source": "checker"}


@pytest.mark.parametrize("algo", ["grpo", "rloo"])  # with a reference model (KL term) and without one
def test_kl_from_start_on_request(tmp_path, algo):
    """logging.kl_from_start=true logs KL(policy || start) every step: 0 at step 1 (it samples the
    start), then above 0 once updates moved the policy; an algorithm without a reference gets the
    start as one. The shipped arith start (correct samples to learn from), 3 steps."""
    main(["run", f"algo={algo}", "logging.kl_from_start=true", "trainer.steps=3", "trainer.prompts_per_step=8",
          "trainer.eval_every=3", "runtime.threads=1", f"run_dir={tmp_path}"])  # fmt: skip
    rows = metrics(tmp_path)[1:]
    assert len(rows) == 3 and rows[0]["kl/from_start"] == pytest.approx(0.0, abs=1e-5)
    assert rows[2]["kl/from_start"] > 1e-4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["reward.source=modle"], "reward.source='modle': use checker, model, mix or random"),
        (["reward.source=random", "reward.random_rate=1"], "reward.random_rate=1.0 must be in (0, 1)"),
        (["reward.source=random", "algo=prime"], "algo=prime learns from the checker's"),
        (["reward.source=model"], "reward.source=model needs reward.model_path"),
        (["reward.source=mix", "reward.model_path=tiny", "reward.model_weight=2"], "reward.model_weight=2.0 must be in"),
        (["reward.source=model", "reward.model_path=/nonexistent/rm"], "reward.model_path=/nonexistent/rm: not a model directory"),
        (["reward.source=model", "reward.model_path=tiny", "algo=prime"], "algo=prime learns from the checker's"),
    ],
)
def test_bad_reward_settings_are_one_clear_line(tmp_path, fast_run, overrides, message):
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        main(["run", *fast_run, *overrides, f"run_dir={tmp_path}"])


def test_a_reward_model_with_another_tokenizer_is_refused(tmp_path, fast_run, shared_data):
    import shutil

    main(["rm", "train", "rm.steps=2", "rm.eval_every=1", "model.tiny.sft_steps=20", "runtime.threads=1",
          f"run_dir={tmp_path / 'rm'}"])  # fmt: skip
    other = tmp_path / "other_tokenizer"
    shutil.copytree(tmp_path / "rm" / "reward_model", other)
    for f in other.glob("*token*"):
        f.unlink()
    for f in Path(shared_data, "tokenizers", "qwen2").iterdir():
        shutil.copy(f, other / f.name)
    with pytest.raises(SystemExit, match="its tokenizer differs from the policy's"):
        main(["run", *fast_run, "reward.source=model", f"reward.model_path={other}", f"run_dir={tmp_path / 'run'}"])


@pytest.mark.learning
@pytest.mark.full  # 400 steps each (7 + 16 min on a 2-core Xeon): make test-learning-full, not CI
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_algorithm_learns_arith_from_the_reward_model_alone(algo, tmp_path):
    """GRPO and PPO trained on the tiny reward model only (rm.* defaults, cached for the session)
    raise the checker's eval accuracy: the mean of the last three evals beats the start by 0.04,
    as in tests/algorithms/test_learning.py. Measured (2 idle cores, seed 0, 400 steps): see
    docs/reward_models.md."""
    run_dir = tmp_path / algo
    main(["run", f"algo={algo}", "reward.source=model", "reward.model_path=tiny", "trainer.steps=400",
          "trainer.eval_every=50", "trainer.checkpoint_every=0", "seed=0", "runtime.threads=1", f"run_dir={run_dir}"])
    evals = [(r["step"], r["eval/arith/accuracy"]) for r in metrics(run_dir) if "eval/arith/accuracy" in r]
    late = [acc for _, acc in evals[-3:]]
    assert evals[-1][0] == 400
    assert sum(late) / 3 - evals[0][1] >= 0.04, f"{algo}: {evals}"
    rows = metrics(run_dir)[1:]
    assert all("reward/model_mean" in r and "reward/gold_accuracy" in r for r in rows)
