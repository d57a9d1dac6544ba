"""GSPO on hand-computed batches: the sequence ratio, its clipping and its exact gradient."""

import math

import pytest
import torch

import algorithms
from algorithms import MicroBatch, ops
from tests.helpers import make_batch as shared_make_batch


def make_batch(scores, group_ids, T=3, mask=None):
    return shared_make_batch(scores, group_ids, T=T, mask=mask)


def gspo(**overrides):
    cls = algorithms.get_class("gspo")
    return cls(cls.config_class(**overrides))


def test_defaults():
    cfg = gspo().cfg
    assert (cfg.clip_low, cfg.clip_high) == (3e-4, 4e-4) and cfg.kl_coef == 0
    assert cfg.loss_agg == "seq_mean_token_mean"


def test_group_normalised_advantage():
    adv, _ = gspo().advantages(make_batch([1, 0, 1, 1], [0, 0, 1, 1]))
    # group 0: mean 0.5, std sqrt(0.5) -> +-0.7071; group 1: equal -> 0
    assert torch.allclose(adv[:, 0], torch.tensor([0.7071068, -0.7071068, 0.0, 0.0]), atol=1e-5)


def _case():
    batch = make_batch([1, 0], [0, 0], mask=[[1, 1, 0], [1, 1, 0]])
    batch.advantages = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0]])
    batch.old_logp = torch.zeros(2, 3)
    logp = torch.tensor([[math.log(1.2), math.log(0.8), 5.0]] * 2, requires_grad=True)  # 5.0: padding
    return batch, logp


def test_sequence_ratio_clipping_by_hand():
    batch, logp = _case()
    loss, stats = gspo().loss(logp, torch.zeros(2, 3), MicroBatch(batch, 4.0, 2.0, 3))
    s = math.sqrt(1.2 * 0.8)  # exp(mean(log 1.2, log 0.8)) = sqrt(0.96) = 0.979796 (padding ignored)
    # row 0, A=+1: max(-s, -clip(s, 0.9997, 1.0004)) = -s (unclipped)
    # row 1, A=-1: max(s, 0.9997) = 0.9997 (clipped: no gradient)
    assert loss.item() == pytest.approx((-s + (1 - 3e-4)) / 2, abs=1e-6)
    assert stats["policy/clipfrac"] == pytest.approx(0.5)
    loss.backward()
    # row 0: d(-s)/dlogp_t = -s / |y| = -s/2 per valid token, / 2 rows -> -0.244949
    assert torch.allclose(logp.grad, torch.tensor([[-s / 4, -s / 4, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6)


def test_gradient_equals_sequence_level_objective():
    batch, logp = _case()
    batch.advantages = torch.tensor([[0.7, 0.7, 0.0], [0.3, 0.3, 0.0]])
    algo = gspo(clip_low=0.5, clip_high=0.5)
    loss, _ = algo.loss(logp, torch.zeros(2, 3), MicroBatch(batch, 4.0, 2.0, 3))
    (g_token,) = torch.autograd.grad(loss, logp)
    # the paper's form: s_i = exp(mean_t log-ratio) with gradient through the mean
    logp2 = logp.detach().clone().requires_grad_(True)
    s = torch.exp(ops.masked_mean(logp2 - batch.old_logp, batch.response_mask, dim=-1))
    a = batch.advantages[:, 0]
    ref = torch.maximum(-a * s, -a * s.clamp(0.5, 1.5)).mean()
    (g_seq,) = torch.autograd.grad(ref, logp2)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(g_token, g_seq, atol=1e-6)
