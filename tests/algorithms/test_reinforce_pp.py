"""REINFORCE++ and REINFORCE++-baseline on hand-computed batches."""

import math

import torch

import algorithms
from algorithms import ops
from tests.helpers import make_batch as shared_make_batch


def make_batch(scores, group_ids, T=3, mask=None):
    return shared_make_batch(scores, group_ids, T=T, mask=mask)


def make(name, **overrides):
    cls = algorithms.get_class(name)
    return cls(cls.config_class(**overrides))


def test_needs_reference_and_early_logp_with_kl():
    needs = make("reinforce_pp").needs  # default kl_coef 0.001
    assert needs.has("reference") and needs.logp_before_advantages
    needs = make("reinforce_pp", kl_coef=0.0).needs
    assert not needs.has("reference") and not needs.logp_before_advantages
    assert make("reinforce_pp_baseline").kl_placement == "reward"


def test_last_token_rewards_handles_padding_and_empty_rows():
    out = ops.outcome_at_last_token(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]]))
    assert torch.equal(out, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]]))


def test_returns_are_whitened_over_the_batch_without_kl():
    batch = make_batch([1, 0], [0, 1], mask=[[1, 1, 0], [1, 1, 1]])
    adv, _ = make("reinforce_pp", kl_coef=0.0).advantages(batch)
    # returns (gamma 1): row 0 [1, 1, -], row 1 [0, 0, 0]; valid values 1,1,0,0,0:
    # mean 0.4, unbiased var (2 * 0.36 + 3 * 0.16) / 4 = 0.3
    std = math.sqrt(0.3)
    expected = torch.tensor([[0.6 / std, 0.6 / std, 0.0], [-0.4 / std] * 3])
    assert torch.allclose(adv, expected, atol=1e-5)
    assert torch.equal(batch.returns, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))


def test_token_kl_reward_and_discounted_return():
    batch = make_batch([1, 0], [0, 0], mask=[[1, 1, 1], [1, 0, 0]])
    batch.old_logp = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    batch.ref_logp = torch.tensor([[-1.2, -1.4, -1.6], [-1.0, -9.0, -9.0]])  # k1 = 0.2, 0.4, 0.6 on row 0
    algo = make("reinforce_pp", kl_coef=0.1, gamma=0.5)
    adv, _ = algo.advantages(batch)
    # token rewards row 0: -0.02, -0.04, -0.06 + 1 = 0.94; row 1: 0 (padding ignored)
    assert torch.allclose(batch.token_rewards, torch.tensor([[-0.02, -0.04, 0.94], [0.0, 0.0, 0.0]]), atol=1e-6)
    # returns, gamma 0.5: G2 = 0.94, G1 = -0.04 + 0.47 = 0.43, G0 = -0.02 + 0.215 = 0.195
    assert torch.allclose(batch.returns, torch.tensor([[0.195, 0.43, 0.94], [0.0, 0.0, 0.0]]), atol=1e-6)
    valid = torch.tensor([0.195, 0.43, 0.94, 0.0])
    expected = (valid - valid.mean()) / valid.std()
    assert torch.allclose(adv[batch.response_mask], expected, atol=1e-4)
    assert adv[1, 1] == 0 and adv[1, 2] == 0


def test_baseline_variant_subtracts_group_mean_first():
    batch = make_batch([1, 0, 1, 1], [0, 0, 1, 1], T=1)
    adv, _ = make("reinforce_pp_baseline", kl_coef=0.0).advantages(batch)
    # centred scores: +0.5, -0.5, 0, 0; whitened: mean 0, unbiased std sqrt(0.5 / 3) = 0.408248
    std = math.sqrt(0.5 / 3)
    assert torch.allclose(adv[:, 0], torch.tensor([0.5 / std, -0.5 / std, 0.0, 0.0]), atol=1e-5)
    # plain REINFORCE++ on the same batch: returns 1, 0, 1, 1 -> an all-correct group still gets +adv
    plain, _ = make("reinforce_pp", kl_coef=0.0).advantages(make_batch([1, 0, 1, 1], [0, 0, 1, 1], T=1))
    assert plain[2, 0] > 0
