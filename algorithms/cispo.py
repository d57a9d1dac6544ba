"""CISPO: Clipped IS-weight Policy Optimization.

MiniMax et al. 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
Attention", arXiv:2506.13585 (Section 3.1).

Objective: REINFORCE with a clipped, stop-gradient importance-sampling weight, so no
token is ever dropped from the gradient (PPO/GRPO clipping zeroes the gradient of the
rare, high-ratio "fork" tokens after the first update):

    r_t  = pi(y_t) / pi_old(y_t),   r^_t = clip(r_t, 1 - eps_low, 1 + eps_high)
    J    = 1 / sum_i |y_i| * sum_i sum_t sg(r^_t) A_i log pi(y_t)

with the GRPO group-normalised advantage A_i and a token-level mean (``token_mean``).
The paper sets no lower bound on the IS weight (eps_low large: here 1.0, i.e. a floor
of 0) and tunes only eps_high.

Deviations: the paper does not report its eps_high; the default 0.28 is DAPO's
clip-higher value (as in other open implementations). The optional token mask of the
paper's unified formulation is not implemented. ``policy/clipfrac`` is the fraction of
tokens whose IS weight was clipped. ``kl_coef`` > 0 adds GRPO's KL loss term (outside
the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, GroupAdvantage, MicroBatch
from algorithms.parts import param, register_loss

_LOG_RATIO_CLAMP = 20.0


@dataclass
class CISPOConfig(AlgoConfig):
    name: str = "cispo"
    samples_per_prompt: int = 8  # G, responses per prompt
    loss_agg: str = "token_mean"  # 1 / sum_i |y_i| over all tokens
    clip_low: float = 1.0  # eps_low: 1.0 = no lower bound on the IS weight (paper)
    clip_high: float = 0.28  # eps_high: IS weight capped at 1 + eps_high (not reported in the paper)
    kl_coef: float = 0.0  # no KL term in the paper
    eps: float = 1e-6  # added to the group std


def cispo_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
    clip_low: float, clip_high: float,
) -> tuple[torch.Tensor, dict]:
    """Per-token loss -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logp (0 at padding), stats."""
    adv = advantages.to(logp.dtype)
    if adv.dim() == logp.dim() - 1:
        adv = adv.unsqueeze(-1)
    log_ratio = (logp.detach() - old_logp.to(logp.dtype)).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -weight * adv * logp
    m = mask.to(logp.dtype)
    loss = torch.where(m != 0, loss * m, torch.zeros_like(loss))
    stats = {
        "clipfrac": float(ops.masked_mean((weight != ratio).to(logp.dtype), m)),
        "approx_kl": float(ops.masked_mean(-log_ratio, m)),
    }
    return loss, stats


@register_algorithm("cispo", summary="clipped stop-gradient IS weight x advantage x log-prob, token mean (2506.13585)")
class CISPO(GroupAdvantage):
    config_class = CISPOConfig
    metadata = {
        "baseline": "group mean",
        "normalisation": "group std",
        "kl": "none",
        "aggregation": "token_mean",
        "extra models": "none",
        "extra generation": "none",
    }


    def policy_loss(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        return cispo_loss(self, logp, mb)


@register_loss("cispo", "REINFORCE with the clipped, stop-gradient IS weight (2506.13585)", clip_low=1.0, clip_high=0.28)
def cispo_loss(algo, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
    b, dev = mb.batch, logp.device
    return cispo_surrogate(
        logp, b.old_logp.to(dev), b.advantages.to(dev), b.response_mask.to(dev), param(algo, "cispo", "clip_low"),
        param(algo, "cispo", "clip_high"),
    )
