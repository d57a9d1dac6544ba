"""GMPO: Geometric-Mean Policy Optimization.

Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv:2507.20673.

Objective: GRPO's group-normalised advantage A_i, but each response's importance ratio is the
geometric mean of its token ratios instead of their arithmetic mean, which an outlier token
ratio cannot drag far (the paper's motivation: stabler ratios, so a wider clip range):

    r_i,t = pi(y_t) / pi_old(y_t),   l_i,t = log r_i,t
    J     = 1/G sum_i sgn(A_i) * prod_t | min(r_i,t A_i, clip(r_i,t, e^-eps_low, e^eps_high) A_i) |^(1/|y_i|)

The clip acts per token in log space (l clipped to [-eps_low, eps_high], the paper's default
0.4 both ways, i.e. ratios in [0.67, 1.49]), and the min keeps the pessimistic branch for the
sign of A_i. Written with logs this is

    J = 1/G sum_i A_i exp( 1/|y_i| sum_t sgn(A_i) min(sgn(A_i) l_i,t, sgn(A_i) clip(l_i,t)) )

which is what ``geometric_mean_surrogate`` computes, in a per-token form (as GSPO's): each token
of response i carries the value -A_i rbar_i and the gradient -A_i rbar_i grad l_i,t (0 where its
branch is clipped); averaged per response and then over responses (``seq_mean_token_mean``)
this is exactly the gradient of -A_i rbar_i, the sequence objective. No KL term (the paper drops it).

Deviations: none by default. ``policy/clipfrac`` is the fraction of tokens on the clipped
branch. ``kl_coef`` > 0 adds GRPO's KL loss term (outside the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, GroupAdvantage, MicroBatch
from algorithms.parts import param, register_loss

_LOG_RATIO_CLAMP = 20.0


@dataclass
class GMPOConfig(AlgoConfig):
    name: str = "gmpo"
    samples_per_prompt: int = 8  # G, responses per prompt
    loss_agg: str = "seq_mean_token_mean"  # one ratio per response, mean over responses (paper)
    clip_low: float = 0.4  # eps_low: log-ratio clipped below at -0.4 (paper)
    clip_high: float = 0.4  # eps_high: log-ratio clipped above at +0.4 (paper)
    kl_coef: float = 0.0  # the paper has no KL term
    eps: float = 1e-6  # added to the group std


def geometric_mean_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    clip_low: float, clip_high: float,
) -> tuple[torch.Tensor, dict]:
    """[B, T] loss -A_i * rbar_i at every valid token of response i (0 at padding), and stats; rbar_i is
    the geometric mean of the response's token ratios after the sign-aware log-space clip."""
    adv = advantages.to(logp.dtype)
    if adv.dim() == logp.dim():  # per-token advantages of an outcome reward: one value per response
        adv = ops.masked_sum(adv, mask, dim=-1) / mask.to(logp.dtype).sum(-1).clamp(min=1)
    sign = torch.sign(adv)[:, None]
    log_ratio = (logp - old_logp.to(logp.dtype)).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    clipped = log_ratio.clamp(-clip_low, clip_high)
    chosen = sign * torch.minimum(sign * log_ratio, sign * clipped)  # the pessimistic branch for A's sign
    m = mask.to(logp.dtype)
    seq_ratio = torch.exp(ops.masked_mean(chosen.detach(), m, dim=-1))  # [B] rbar_i, no gradient
    # Token form: value -A_i rbar_i at each token, gradient -A_i rbar_i grad(chosen_t); averaged per response
    # this is the gradient of -A_i rbar_i, and each token's gradient is its own (so token masks apply).
    loss = -(adv * seq_ratio)[:, None] * (1.0 + chosen - chosen.detach())
    loss = torch.where(m != 0, loss * m, torch.zeros_like(loss))
    with torch.no_grad():
        on_clip = (sign * clipped < sign * log_ratio).to(logp.dtype)
        stats = {"clipfrac": float(ops.masked_mean(on_clip, m)), "approx_kl": float(ops.masked_mean(-log_ratio, m))}
    return loss, stats


@register_algorithm("gmpo", summary="geometric mean of token ratios, log-space clip, group-normalised advantage (2507.20673)")
class GMPO(GroupAdvantage):
    config_class = GMPOConfig
    metadata = {
        "baseline": "group mean",
        "normalisation": "group std",
        "kl": "none",
        "aggregation": "seq_mean_token_mean (geometric-mean sequence ratio)",
        "extra models": "none",
        "extra generation": "none",
    }

    def policy_loss(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        return gmpo_loss(self, logp, mb)


@register_loss("gmpo", "geometric mean of the token ratios, clipped in log space (2507.20673)", clip_low=0.4,
               clip_high=0.4)  # fmt: skip
def gmpo_loss(algo, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
    b, dev = mb.batch, logp.device
    return geometric_mean_surrogate(
        logp, b.old_logp.to(dev), b.advantages.to(dev), b.response_mask.to(dev), param(algo, "gmpo", "clip_low"),
        param(algo, "gmpo", "clip_high"),
    )
