"""Dr. GRPO on hand-computed batches."""

import torch

from algorithms import MicroBatch
from algorithms.dr_grpo import DrGRPO  # imported directly: registers it even before it is a listed built-in
from tests.helpers import make_batch as shared_make_batch


def make_batch(scores, group_ids, T=2, mask=None):
    return shared_make_batch(scores, group_ids, T=T, mask=mask)


def dr_grpo(**overrides):
    return DrGRPO(DrGRPO.config_class(**overrides))


def test_defaults_follow_the_paper():
    algo = dr_grpo()
    assert DrGRPO.name == "dr_grpo" and algo.cfg.name == "dr_grpo"
    assert algo.cfg.loss_agg == "seq_mean_token_sum_norm" and algo.cfg.kl_coef == 0
    assert algo.cfg.scale_by_std is False and algo.needs.has("reference") is False
    assert algo.metadata["normalisation"] == "none"


def test_advantage_is_mean_centred_without_std():
    adv, _ = dr_grpo().advantages(make_batch([1, 0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1]))
    # group 0: mean 0.25 -> 0.75, -0.25 x3 (GRPO would divide by std 0.5 -> 1.5, -0.5); group 1: 0
    assert torch.allclose(adv[:, 0], torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0]))


def test_loss_divides_token_sums_by_the_constant_max_length():
    algo = dr_grpo()
    batch = make_batch([1, 0], [0, 0], T=3, mask=[[1, 1, 1], [1, 0, 0]])
    batch.advantages = torch.tensor([[1.0, 1, 1], [-1.0, 0, 0]])
    batch.old_logp = torch.zeros(2, 3)
    logp = torch.zeros(2, 3, requires_grad=True)  # ratio 1 everywhere
    loss, stats = algo.loss(logp, torch.zeros(2, 3), MicroBatch(batch, 4.0, 2.0, 4))
    # per-token -A: row 0 sums to -3, row 1 to +1; each / L_max = 4, then mean over 2 rows:
    # (-3/4 + 1/4) / 2 = -0.25  (GRPO's per-length mean would give (-1 + 1) / 2 = 0)
    assert abs(loss.item() - (-0.25)) < 1e-6
    loss.backward()
    # d/dlogp = -A / (L_max * B) = -1/8 on row 0, +1/8 on row 1's valid token, 0 at padding
    assert torch.allclose(logp.grad, torch.tensor([[-0.125, -0.125, -0.125], [0.125, 0.0, 0.0]]))
    assert stats["policy/clipfrac"] == 0.0 and "loss/kl" not in stats
