"""PPO (critic, GAE, KL in reward, adaptive controller) and ReMax on hand-computed batches."""

import pytest
import torch

import algorithms
from algorithms import Batch, MicroBatch


def batch_of(scores, mask):
    B, T = len(scores), len(mask[0])
    return Batch(
        prompt_ids=torch.ones(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.ones(B, T, dtype=torch.long), response_mask=torch.tensor(mask, dtype=torch.bool),
        group_ids=torch.arange(B), prompts=[""] * B, responses=[""] * B, ground_truths=[""] * B,
        truncated=torch.zeros(B, dtype=torch.bool), scores=torch.tensor(scores, dtype=torch.float32),
    )


def build(name, **kw):
    cls = algorithms.get_class(name)
    return cls(cls.config_class(**kw))


def test_ppo_needs_critic_and_reference():
    algo = build("ppo")
    needs = algo.needs
    assert [r.name for r in needs.roles] == ["reference", "critic"] and needs.logp_before_advantages
    critic = needs.roles[1]
    assert critic.head == "scalar" and critic.trainable and critic.epochs == 2 and critic.loss == algo.critic_loss
    assert not build("ppo", kl_coef=0.0).needs.has("reference")


def test_ppo_token_rewards_and_gae_by_hand():
    algo = build("ppo", kl_coef=0.1, gamma=1.0, lam=1.0, whiten_advantages=False)
    b = batch_of([1.0], [[1, 1, 0]])
    b.old_logp = torch.tensor([[0.0, -1.0, 0.0]])
    b.ref_logp = torch.zeros(1, 3)
    b.outputs["critic"] = torch.tensor([[0.5, 0.5, 9.0]])  # 9.0 sits on padding and must not matter
    adv, _ = algo.advantages(b)
    # k1 = old - ref = [0, -1]; rewards = [0 - 0.1*0, 1 - 0.1*(-1)] = [0, 1.1]
    assert torch.allclose(b.token_rewards, torch.tensor([[0.0, 1.1, 0.0]]))
    # gamma = lam = 1: A_1 = 1.1 - 0.5 = 0.6, A_0 = 0 + 0.5 - 0.5 + 0.6 = 0.6; returns = A + V = 1.1
    assert torch.allclose(adv, torch.tensor([[0.6, 0.6, 0.0]]))
    assert torch.allclose(b.returns, torch.tensor([[1.1, 1.1, 0.0]]))


def test_ppo_whitened_advantages_have_zero_mean_unit_var():
    algo = build("ppo", kl_coef=0.0)
    b = batch_of([1.0, 0.0, 1.0], [[1, 1, 1], [1, 1, 0], [1, 0, 0]])
    b.outputs["critic"] = torch.rand(3, 3)
    adv, _ = algo.advantages(b)
    valid = adv[b.response_mask]
    assert valid.mean().abs() < 1e-5 and (valid.std() - 1).abs() < 1e-3


def test_ppo_adaptive_kl_controller_moves_towards_target():
    algo = build("ppo", kl_coef=0.1, kl_adaptive=True, kl_target=1.0, kl_horizon=10)
    b = batch_of([0.0, 0.0], [[1, 1], [1, 1]])
    b.old_logp, b.ref_logp, b.outputs["critic"] = torch.zeros(2, 2), torch.full((2, 2), -1.0), torch.zeros(2, 2)
    algo.advantages(b)  # k1 = 0 - (-1) = 1 per token, 2 per sequence > target 1: error clipped to 0.2
    assert algo.beta == pytest.approx(0.1 * (1 + 0.2 * 2 / 10))
    assert algo.state() == {"beta": algo.beta}


def test_ppo_critic_loss_clipped_by_hand():
    algo = build("ppo", value_clip=0.5)
    b = batch_of([0.0], [[1, 1]])
    b.outputs["critic"], b.returns = torch.tensor([[0.0, 0.0]]), torch.tensor([[2.0, 0.0]])
    v = torch.tensor([[1.0, 0.1]], requires_grad=True)
    loss, stats = algo.critic_loss(v, None, MicroBatch(b, 2.0, 1.0, 2))
    # token 0: clipped V = 0.5 -> max((1-2)^2, (0.5-2)^2) = 2.25 ; token 1: max(0.01, 0.01) = 0.01
    assert loss.item() == pytest.approx(0.5 * (2.25 + 0.01) / 2)
    assert stats["critic/vf_clipfrac"] == pytest.approx(0.5)


def test_remax_advantage_is_reward_minus_greedy():
    algo = build("remax")
    assert algo.needs.roles == ()  # no extra model: the greedy pass is extra generation in select
    b = batch_of([1.0, 0.0, 1.0], [[1, 1], [1, 0], [1, 1]])
    b.outputs["greedy_score"] = torch.tensor([1.0, 1.0, 0.0])
    adv, metrics = algo.advantages(b)
    assert torch.equal(adv, torch.tensor([[0.0, 0.0], [-1.0, 0.0], [1.0, 1.0]]))
    assert metrics == {"remax/greedy_reward": pytest.approx(2 / 3)}


class RecordingSampler:
    """Scores a response "1" for prompts ending in "a", "0" otherwise; records what was asked."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, ground_truths, n, temperature):
        self.calls.append((list(prompts), list(ground_truths), n, temperature))
        b = batch_of([1.0 if p.endswith("a") else 0.0 for p in prompts], [[1, 1]] * len(prompts))
        return b


def test_remax_select_asks_for_one_greedy_response_per_prompt():
    algo = build("remax")
    b = batch_of([1.0, 0.0, 1.0, 1.0], [[1, 1]] * 4)
    b.group_ids = torch.tensor([0, 0, 1, 1])
    b.prompts, b.ground_truths = ["pa", "pa", "pb", "pb"], ["ta", "ta", "tb", "tb"]
    sampler = RecordingSampler()
    out, metrics = algo.select(b, sampler)
    assert sampler.calls == [(["pa", "pb"], ["ta", "tb"], 1, 0.0)]  # one temperature-0 response per prompt
    assert out.outputs["greedy_score"].tolist() == [1.0, 1.0, 0.0, 0.0] and metrics == {}
    # and the baseline travels with the rows when the batch is split into micro-batches
    assert out.select(torch.tensor([2, 0])).outputs["greedy_score"].tolist() == [0.0, 1.0]


def test_ppo_critic_warmup_trains_the_critic_only(tmp_path, fast_run):
    """algo.critic_warmup=2: steps 1-2 leave the policy as it is (the step-2 eval equals the start's, no policy
    loss) while the critic learns (loss/value); step 3 updates both. Its steps count in the token budget."""
    import json

    from harness.commands.cli import main

    run_dir = tmp_path / "run"
    main(["run", *fast_run, "algo=ppo", "algo.critic_warmup=2", "trainer.steps=3", "trainer.eval_every=2",
          "rollout.temperature=1.0", f"run_dir={run_dir}"])
    rows = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    for step in (1, 2):
        assert rows[step]["train/policy_frozen"] == 1 and "loss/policy" not in rows[step]
        assert "loss/value" in rows[step] and rows[step]["budget/generated_tokens"] > 0
    assert "train/policy_frozen" not in rows[3] and "loss/policy" in rows[3]
    assert rows[2]["eval/arith/accuracy"] == rows[0]["eval/arith/accuracy"]
    assert rows[2]["eval/arith/response_tokens_mean"] == rows[0]["eval/arith/response_tokens_mean"]
    from algorithms.ppo import PPO, PPOConfig

    assert PPO(PPOConfig()).trains_policy(1)  # default: no warm-up, the policy trains from step 1
    assert [PPO(PPOConfig(critic_warmup=2)).trains_policy(s) for s in (1, 2, 3)] == [False, False, True]
