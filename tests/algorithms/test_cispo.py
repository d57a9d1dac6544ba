"""CISPO on hand-computed batches."""

import math

import pytest
import torch

from algorithms import MicroBatch
from tests.helpers import build, make_batch


def cispo(**overrides):
    return build("cispo", **overrides)


def test_defaults():
    cfg = cispo().cfg
    assert cfg.clip_low == 1.0 and cfg.clip_high == 0.28 and cfg.loss_agg == "token_mean" and cfg.kl_coef == 0
    assert cispo().needs.has("reference") is False


def test_group_normalised_advantage():
    adv, _ = cispo().advantages(make_batch([1, 0, 0, 1], [0, 0, 0, 0]))
    # mean 0.5, unbiased std sqrt(1/3): +-0.8660
    assert torch.allclose(adv[:, 0], torch.tensor([0.8660254, -0.8660254, -0.8660254, 0.8660254]), atol=1e-5)


def test_loss_keeps_gradient_of_clipped_tokens():
    algo = cispo()
    batch = make_batch([1.0], [0])
    batch.advantages = torch.ones(1, 2)
    batch.old_logp = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    loss, stats = algo.loss(logp, torch.zeros(1, 2), MicroBatch(batch, 2.0, 1.0, 2))
    # IS weights: clip(1.5, 0, 1.28) = 1.28, clip(0.5, 0, 1.28) = 0.5 (no lower bound)
    # loss = mean_t -w_t * A * logp_t = (-1.28 * log 1.5 - 0.5 * log 0.5) / 2 = -0.0862107
    expected = (-1.28 * math.log(1.5) - 0.5 * math.log(0.5)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["policy/clipfrac"] == pytest.approx(0.5)
    assert stats["policy/approx_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 2, abs=1e-6)
    loss.backward()
    # grad = -sg(w) * A / N_tok: the clipped token still gets -1.28 / 2 = -0.64 (PPO would give 0)
    assert torch.allclose(logp.grad, torch.tensor([[-0.64, -0.25]]))


def test_negative_advantage_and_lower_bound():
    algo = cispo(clip_low=0.2)
    batch = make_batch([0.0], [0])
    batch.advantages = -torch.ones(1, 2)
    batch.old_logp = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    loss, _ = algo.loss(logp, torch.zeros(1, 2), MicroBatch(batch, 2.0, 1.0, 2))
    loss.backward()
    # weights 1.28 and max(0.5, 0.8) = 0.8; grad = +w / 2
    assert torch.allclose(logp.grad, torch.tensor([[0.64, 0.4]]))
