"""GMPO, GPG, SAPO, Clip-Cov, KL-Cov and the high-entropy-token option, on batches computed by hand
from each paper's formula (edge cases: equal rewards, ratios at the clip or gate boundary, empty masks)."""

import math

import pytest
import torch

from algorithms import MicroBatch, ops
from tests.helpers import build, make_batch


def _loss(name, logp, old, adv, mask=None, entropy=None, seqs=None, **cfg):
    """(loss, stats, logp.grad) of ``name``'s full loss on one micro-batch (the minibatch's own totals)."""
    logp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    B, T = logp.shape
    batch = make_batch([0.0] * B, list(range(B)), T=T, mask=mask)
    batch.old_logp = torch.tensor(old, dtype=torch.float64)
    batch.advantages = torch.tensor(adv, dtype=torch.float64)
    m = batch.response_mask
    ent = torch.zeros(B, T, dtype=torch.float64) if entropy is None else torch.tensor(entropy, dtype=torch.float64)
    loss, stats = build(name, **cfg).loss(logp, ent, MicroBatch(batch, float(m.sum()), float(seqs or B), T))
    loss.backward()
    return loss.item(), stats, logp.grad


# ----------------------------------------------------------------------------- GMPO
def test_gmpo_geometric_mean_of_clipped_token_ratios():
    # log-ratios 0.1 and 0.6, A = +1, clip 0.4: the pessimistic branch is min(l, clip(l)) = 0.1, 0.4
    # rbar = exp((0.1 + 0.4) / 2) = exp(0.25); loss = -A rbar (one response)
    loss, stats, grad = _loss("gmpo", [[0.1, 0.6]], [[0.0, 0.0]], [[1.0, 1.0]])
    assert loss == pytest.approx(-math.exp(0.25))
    assert stats["policy/clipfrac"] == pytest.approx(0.5)
    # d(-rbar)/dl_1 = -rbar / 2; the clipped token gets nothing
    assert grad.tolist() == [[pytest.approx(-math.exp(0.25) / 2), 0.0]]
    # A = -1: the pessimistic branch is max(l, clip(l)) = 0.1, 0.6 (unclipped): loss = +exp(0.35)
    loss, stats, grad = _loss("gmpo", [[0.1, 0.6]], [[0.0, 0.0]], [[-1.0, -1.0]])
    assert loss == pytest.approx(math.exp(0.35)) and stats["policy/clipfrac"] == 0.0
    assert grad.tolist() == [[pytest.approx(math.exp(0.35) / 2)] * 2]
    # A = -1 below the lower bound: l = -0.5 -> clipped at -0.4, no gradient there
    loss, stats, grad = _loss("gmpo", [[-0.5, 0.0]], [[0.0, 0.0]], [[-1.0, -1.0]])
    assert loss == pytest.approx(math.exp(-0.2)) and grad[0, 0] == 0.0 and stats["policy/clipfrac"] == 0.5


def test_gmpo_ratio_at_the_boundary_and_edge_cases():
    # exactly at the bound (l = 0.4): both branches equal, the gradient flows (as PPO's at its bound)
    loss, _, grad = _loss("gmpo", [[0.4]], [[0.0]], [[1.0]])
    assert loss == pytest.approx(-math.exp(0.4)) and grad[0, 0] == pytest.approx(-math.exp(0.4))
    # equal rewards in a group: advantage 0, loss 0, no gradient
    algo = build("gmpo")
    adv, _ = algo.advantages(make_batch([1, 1, 1, 1], [0, 0, 0, 0]))
    assert torch.equal(adv, torch.zeros(4, 2))
    loss, _, grad = _loss("gmpo", [[0.3, 0.2]], [[0.0, 0.0]], [[0.0, 0.0]])
    assert loss == 0.0 and torch.equal(grad, torch.zeros(1, 2, dtype=torch.float64))
    # a response with no valid token: contributes 0, never NaN; the other one as alone (seq mean over 2 seqs)
    loss, _, grad = _loss("gmpo", [[0.1, 0.1], [0.2, 0.2]], [[0.0] * 2] * 2, [[1.0, 1.0], [1.0, 1.0]],
                          mask=[[True, True], [False, False]])
    assert loss == pytest.approx(-math.exp(0.1) / 2) and not torch.isnan(grad).any() and grad[1].abs().sum() == 0


# ----------------------------------------------------------------------------- GPG
def test_gpg_advantage_with_the_alpha_correction():
    # group 0: rewards 1, 0, 0, 1 -> A = r - mean = +-0.5 (no std division); group 1: all 0 -> A = 0 (M = 4)
    # alpha = B / (B - M) = 8 / 4 = 2
    algo = build("gpg")
    adv, metrics = algo.advantages(make_batch([1, 0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]))
    assert metrics["adv/gpg_alpha"] == 2.0
    assert adv[:, 0].tolist() == [1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # every group uniform: no signal, alpha 1, all advantages 0
    adv, metrics = algo.advantages(make_batch([1, 1, 0, 0], [0, 0, 1, 1]))
    assert metrics["adv/gpg_alpha"] == 1.0 and torch.equal(adv, torch.zeros(4, 2))
    # no group uniform: alpha 1; std_norm divides by the unbiased group std sqrt(1/3)
    adv, metrics = build("gpg", std_norm=True).advantages(make_batch([1, 0, 0, 1], [0, 0, 0, 0]))
    assert metrics["adv/gpg_alpha"] == 1.0 and adv[0, 0].item() == pytest.approx(0.5 / math.sqrt(1 / 3), rel=1e-5)
    # float rewards that sum with rounding (0.1 x 3) are still one uniform group
    assert ops.uniform_group_rows(torch.tensor([0.1, 0.1, 0.1, 0.3]), [0, 0, 0, 1]).tolist() == [True, True, True, False]


def test_gpg_loss_is_the_plain_policy_gradient():
    # loss = -1/N_tok sum A_t logp_t; no ratio, no clip: grad = -A_t / N_tok whatever old_logp is
    loss, stats, grad = _loss("gpg", [[-0.5, -1.0], [-2.0, -0.1]], [[-3.0, 0.0], [0.0, 0.0]], [[2.0, 2.0], [-1.0, -1.0]],
                              mask=[[True, True], [True, False]])
    assert loss == pytest.approx(-(2 * -0.5 + 2 * -1.0 + -1 * -2.0) / 3)
    assert grad.tolist() == [[pytest.approx(-2 / 3), pytest.approx(-2 / 3)], [pytest.approx(1 / 3), 0.0]]
    assert stats["policy/clipfrac"] == 0.0


# ----------------------------------------------------------------------------- SAPO
def test_sapo_soft_gate_by_hand():
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    r = 1.5
    # A = +1, tau_pos = 1: loss = -sigma(0.5) * 4 (one token); grad wrt logp = -A * 4 s(1-s) * r
    loss, stats, grad = _loss("sapo", [[math.log(r)]], [[0.0]], [[1.0]])
    assert loss == pytest.approx(-4 * sig(0.5))
    assert grad[0, 0] == pytest.approx(-4 * sig(0.5) * (1 - sig(0.5)) * r)
    assert stats["policy/clipfrac"] == 0.0  # weight 4 s (1 - s) = 0.94 > 1/2
    # A = -1, tau_neg = 1.05: loss = +sigma(1.05 * 0.5) * 4 / 1.05
    loss, _, grad = _loss("sapo", [[math.log(r)]], [[0.0]], [[-1.0]])
    assert loss == pytest.approx(4 * sig(0.525) / 1.05)
    assert grad[0, 0] == pytest.approx(4 * sig(0.525) * (1 - sig(0.525)) * r)


def test_sapo_on_policy_is_the_unclipped_gradient_and_the_gate_decays():
    # r = 1: gate weight 4 x 1/4 = 1, so grad = -A / N_tok exactly, for either sign and temperature
    _, _, grad = _loss("sapo", [[-0.7, -0.2]], [[-0.7, -0.2]], [[1.5, 1.5]], tau_pos=3.0)
    assert grad.tolist() == [[pytest.approx(-0.75), pytest.approx(-0.75)]]
    _, _, grad = _loss("sapo", [[-0.7]], [[-0.7]], [[-2.0]], tau_neg=5.0)
    assert grad[0, 0] == pytest.approx(2.0)
    # far off-policy (r = e^2 = 7.4, tau 1): the gate's weight 4 s(1 - s) r is ~0.05, against PPO's 0 at a
    # clip and the unclipped 7.4: soft, not a cliff; that token counts as damped
    loss, stats, grad = _loss("sapo", [[2.0]], [[0.0]], [[1.0]])
    s = 1 / (1 + math.exp(-(math.exp(2) - 1)))
    assert grad[0, 0] == pytest.approx(-4 * s * (1 - s) * math.exp(2)) and 0 < -grad[0, 0] < 0.1
    assert stats["policy/clipfrac"] == 1.0
    with pytest.raises(ValueError, match="temperatures"):
        _loss("sapo", [[0.0]], [[0.0]], [[1.0]], tau_pos=0.0)
    loss, _, grad = _loss("sapo", [[0.3]], [[0.0]], [[0.0]])  # equal rewards: A = 0
    assert loss == 0.0 and grad[0, 0] == 0.0


# ----------------------------------------------------------------------------- Clip-Cov / KL-Cov
def test_token_covariance_by_hand():
    logp = torch.tensor([[-1.0, -3.0], [-2.0, 0.0]])
    adv = torch.tensor([[2.0, 2.0], [-1.0, -1.0]])
    mask = torch.tensor([[True, True], [True, False]])
    # valid tokens: logp -1, -3, -2 (mean -2); A 2, 2, -1 (mean 1) -> (1)(1), (-1)(1), (0)(-2)
    assert ops.token_covariance(logp, adv, mask).tolist() == [[1.0, -1.0], [0.0, 0.0]]
    assert ops.token_covariance(logp, adv, torch.zeros(2, 2, dtype=torch.bool)).abs().sum() == 0


def test_clip_cov_detaches_a_token_in_the_covariance_band():
    # logp -1, -3, -2, -2 (mean -2); A 3, 3, -1, -1 (mean 1): Cov = 2, -2, 0, 0 -> only token (0, 0) lies in [1, 5]
    logp, old = [[-1.0, -3.0], [-2.0, -2.0]], [[-1.0, -3.0], [-2.0, -2.0]]  # on-policy: nothing clipped by PPO
    adv = [[3.0, 3.0], [-1.0, -1.0]]
    loss, stats, grad = _loss("clip_cov", logp, old, adv)
    assert stats["policy/covfrac"] == pytest.approx(0.25)
    # token_mean over 4 tokens of -A rho (rho = 1), token (0, 0) zeroed: (-3 + 1 + 1) / 4
    assert loss == pytest.approx(-1 / 4)
    assert grad.tolist() == [[0.0, pytest.approx(-3 / 4)], [pytest.approx(1 / 4), pytest.approx(1 / 4)]]
    # no token in the band: plain GRPO surrogate
    loss, stats, _ = _loss("clip_cov", logp, old, adv, cov_low=10.0, cov_high=20.0)
    assert stats["policy/covfrac"] == 0.0 and loss == pytest.approx((-3 - 3 + 1 + 1) / 4)
    # a token already on PPO's clipped branch is not a candidate: raise token (0, 0)'s ratio past 1.2
    loss, stats, _ = _loss("clip_cov", [[-1.0 + 0.5, -3.0], [-2.0, -2.0]], old, adv)
    assert stats["policy/covfrac"] == 0.0 and stats["policy/clipfrac"] == pytest.approx(0.25)


def test_kl_cov_penalises_the_top_covariance_tokens():
    # Cov as above: 2, -2, 0, 0; k = max(1, floor(0.25 x 4)) = 1 -> token (0, 0) gets + beta |log rho|
    logp = [[-0.9, -3.0], [-2.0, -2.0]]
    old = [[-1.0, -3.0], [-2.0, -2.0]]
    adv = [[3.0, 3.0], [-1.0, -1.0]]
    loss, stats, grad = _loss("kl_cov", logp, old, adv, cov_frac=0.25, cov_kl_coef=2.0)
    rho = math.exp(0.1)
    assert stats["policy/covfrac"] == pytest.approx(0.25) and stats["policy/clipfrac"] == 0.0
    assert loss == pytest.approx((-3 * rho + 2.0 * 0.1 - 3 + 1 + 1) / 4)
    # d/dl of -A rho + beta |l| at l = 0.1 > 0: -3 rho + 2; unclipped elsewhere: -A / 4
    assert grad[0, 0] == pytest.approx((-3 * rho + 2.0) / 4)
    assert grad[0, 1] == pytest.approx(-3 / 4) and grad[1, 0] == pytest.approx(1 / 4)
    # all advantages equal (one uniform batch): covariance 0 everywhere, a penalty of |l| only, no policy term
    loss, _, _ = _loss("kl_cov", [[-0.9, -3.0]], [[-1.0, -3.0]], [[0.0, 0.0]], cov_frac=0.5)
    assert loss == pytest.approx(0.1 / 2)
    # an empty mask: 0, no NaN
    loss, stats, grad = _loss("kl_cov", [[-0.9]], [[-1.0]], [[1.0]], mask=[[False]])
    assert loss == 0.0 and stats["policy/covfrac"] == 0.0 and not torch.isnan(grad).any()


# ----------------------------------------------------------------------------- high-entropy tokens
def test_high_entropy_mask_by_hand():
    ent = torch.tensor([[0.1, 2.0, 0.5], [1.0, 3.0, 9.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    # 5 valid tokens; top 40% = ceil(2) = 2: entropies 3.0 and 2.0 (9.0 is padding)
    assert ops.high_entropy_mask(ent, mask, 0.4).tolist() == [[False, True, False], [False, True, False]]
    # ceil(0.3 x 5) = 2 as well; frac 1 keeps every valid token; 0 keeps none
    assert ops.high_entropy_mask(ent, mask, 0.3).sum() == 2
    assert torch.equal(ops.high_entropy_mask(ent, mask, 1.0), mask)
    assert ops.high_entropy_mask(ent, mask, 0.0).sum() == 0
    # ties at the threshold are all kept; an empty mask keeps nothing
    assert ops.high_entropy_mask(torch.ones(1, 4), torch.ones(1, 4, dtype=torch.bool), 0.5).sum() == 4
    assert ops.high_entropy_mask(ent, torch.zeros(2, 3, dtype=torch.bool), 0.5).sum() == 0


@pytest.mark.parametrize("name", ["grpo", "gmpo", "sapo"])
def test_entropy_token_option_keeps_the_gradient_of_high_entropy_tokens_only(name):
    """algo.entropy_token_frac=0.5 on any algorithm: the policy-gradient term only at the top half of the
    tokens by entropy, with the same denominators (the other tokens' gradient is exactly 0)."""
    logp, old, adv = [[-0.5, -1.0], [-2.0, -0.1]], [[-0.5, -1.0], [-2.0, -0.1]], [[1.0, 1.0], [-0.5, -0.5]]
    entropy = [[0.2, 1.5], [0.9, 0.1]]
    full_loss, _, full = _loss(name, logp, old, adv, entropy=entropy, kl_coef=0.0)
    loss, stats, grad = _loss(name, logp, old, adv, entropy=entropy, kl_coef=0.0, entropy_token_frac=0.5)
    assert stats["policy/entropy_token_frac"] == 0.5
    kept = torch.tensor([[False, True], [True, False]])
    assert torch.equal(grad[kept], full[kept])  # each token's gradient is its own (GMPO in its token form)
    assert torch.equal(grad[~kept], torch.zeros(2, dtype=torch.float64))
    assert loss != full_loss
