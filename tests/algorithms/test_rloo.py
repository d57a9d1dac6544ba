"""RLOO on hand-computed batches."""

import pytest
import torch

import algorithms
from algorithms import MicroBatch
from tests.helpers import make_batch as shared_make_batch


def make_batch(scores, group_ids, T=2, mask=None):
    return shared_make_batch(scores, group_ids, T=T, mask=mask)


def rloo(**overrides):
    cls = algorithms.get_class("rloo")
    return cls(cls.config_class(**overrides))


def test_leave_one_out_advantage_by_hand():
    adv, _ = rloo().advantages(make_batch([1, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1], mask=[[1, 1]] * 5 + [[1, 0]]))
    # group 0: baseline of sample 0 = mean(0, 0, 1) = 1/3 -> 2/3; sample 1: 0 - mean(1, 0, 1) = -2/3
    # group 1 (n=2): 1 - 0 = 1 and 0 - 1 = -1
    assert torch.allclose(adv[:, 0], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.0, -1.0]))
    assert adv[5, 1] == 0


def test_kl_folded_into_the_sequence_reward():
    algo = rloo(kl_coef=0.1)
    assert algo.needs.has("reference") and algo.needs.logp_before_advantages
    batch = make_batch([1, 1], [0, 0])
    batch.old_logp = torch.tensor([[-1.0, -1.0], [-2.0, -2.0]])
    batch.ref_logp = torch.tensor([[-1.5, -1.5], [-2.0, -2.0]])
    adv, metrics = algo.advantages(batch)
    # k1 summed over tokens: row 0: 0.5 + 0.5 = 1 -> R = 1 - 0.1 * 1 = 0.9; row 1: R = 1
    # leave-one-out with n = 2: 0.9 - 1 = -0.1 and 1 - 0.9 = +0.1
    assert torch.allclose(adv[:, 0], torch.tensor([-0.1, 0.1]), atol=1e-6)
    # one metric for the KL in any reward: its mean per response token, (0.5 + 0.5 + 0 + 0) / 4
    assert metrics["reward/kl"] == pytest.approx(0.25)


def test_no_kl_needs_no_reference():
    needs = rloo().needs
    assert not needs.has("reference") and not needs.logp_before_advantages
    assert rloo().kl_placement == "reward"


def test_loss_is_reinforce_on_the_sequence_log_prob():
    algo = rloo(kl_coef=0.1)  # KL lives in the reward: no KL term in the loss
    batch = make_batch([1.0], [0], T=3, mask=[[1, 1, 0]])
    batch.advantages = torch.tensor([[0.5, 0.5, 0.0]])
    batch.old_logp = torch.full((1, 3), -1.0)
    batch.ref_logp = torch.full((1, 3), -3.0)
    logp = torch.full((1, 3), -1.0, requires_grad=True)  # ratio 1 (one update per batch)
    loss, stats = algo.loss(logp, torch.zeros(1, 3), MicroBatch(batch, 2.0, 1.0, 3))
    # seq_mean_token_sum: -(0.5 + 0.5) / 1 sequence = -1.0
    assert loss.item() == pytest.approx(-1.0)
    assert "loss/kl" not in stats
    loss.backward()
    # REINFORCE: -A on every valid token of the response
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -0.5, 0.0]]))
