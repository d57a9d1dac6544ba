"""GRPO advantages and loss on hand-computed batches."""

import math

import pytest
import torch

from algorithms import MicroBatch
from tests.helpers import build, make_batch


def grpo(**overrides):
    return build("grpo", **overrides)


def test_group_normalised_advantage_by_hand():
    batch = make_batch([1, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1], mask=[[1, 1]] * 5 + [[1, 0]])
    adv, _ = grpo().advantages(batch)
    # group 0: mean 0.5, unbiased std sqrt(1/3) -> +-0.5*sqrt(3) = +-0.8660; group 1: all equal -> 0
    expected = torch.tensor([0.8660254, -0.8660254, -0.8660254, 0.8660254, 0.0, 0.0])
    assert torch.allclose(adv[:, 0], expected, atol=1e-5)
    assert adv[5, 1] == 0  # masked token gets no advantage


def test_without_std_scaling_is_mean_centred():
    batch = make_batch([1, 0, 0, 0], [0, 0, 0, 0])
    adv, _ = grpo(scale_by_std=False).advantages(batch)
    assert torch.allclose(adv[:, 0], torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_loss_clips_and_adds_k3_kl_by_hand():
    algo = grpo(kl_coef=0.1, loss_agg="token_mean", clip_low=0.2, clip_high=0.2)
    batch = make_batch([1.0], [0])
    batch.advantages = torch.ones(1, 2)
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    batch.old_logp = old
    batch.ref_logp = logp.detach() - math.log(2.0)  # logp - ref = log 2 on both tokens
    loss, stats = algo.loss(logp, torch.zeros(1, 2), MicroBatch(batch, 2.0, 1.0, 2))
    # surrogate: token 1 ratio 1.5 -> clipped 1.2 -> -1.2 ; token 2 ratio 0.5 -> max(-0.5,-0.8) = -0.5
    # k3 with ref - logp = -log 2: exp(-log2) + log2 - 1 = 0.193147
    expected = (-1.2 - 0.5) / 2 + 0.1 * (0.5 + math.log(2) - 1)
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert stats["policy/clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # token 1 is clipped: no surrogate gradient; only the KL term's gradient remains
    kl_grad = 0.1 * (1 - math.exp(-math.log(2))) / 2
    assert logp.grad[0, 0].item() == pytest.approx(kl_grad, abs=1e-5)


def test_kl_off_needs_no_reference():
    assert grpo(kl_coef=0.0).needs.has("reference") is False
    assert grpo().needs.has("reference") is True  # the paper's beta = 0.04
