"""SAPO: Soft Adaptive Policy Optimization.

Gao et al. (Qwen team) 2025, "Soft Adaptive Policy Optimization", arXiv:2511.20347.

Objective: GRPO's group-normalised advantage A_i, with PPO's hard clip of the token ratio
replaced by a smooth, temperature-controlled gate:

    r_i,t = pi(y_t) / pi_old(y_t)
    f(r)  = sigma(tau (r - 1)) * 4 / tau,        tau = tau_pos if A_i > 0 else tau_neg
    J     = 1/G sum_i 1/|y_i| sum_t f(r_i,t) A_i

Its gradient is A_i * 4 sigma(tau(r-1)) (1 - sigma(tau(r-1))) * r * grad log pi: exactly the
unclipped policy gradient on-policy (r = 1, where the gate's weight is 4 x 1/4 = 1), decaying
smoothly as r leaves 1 instead of dropping to 0 at a clip boundary. tau_neg > tau_pos makes the
gate of negative-advantage tokens decay faster (the paper: their updates spread over many
unsampled tokens and destabilise training). Defaults tau_pos = 1.0, tau_neg = 1.05 (paper).
No KL term.

Deviations: none by default (``seq_mean_token_mean``, the paper's 1/G sum_i 1/|y_i| sum_t).
``policy/clipfrac`` reports the fraction of tokens whose gate weight has fallen below 1/2
(|tau(r - 1)| > 1.76), a soft analogue of PPO's clip fraction. ``kl_coef`` > 0 adds GRPO's KL
loss term (outside the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, GroupAdvantage, MicroBatch
from algorithms.parts import param, register_loss

_LOG_RATIO_CLAMP = 20.0


@dataclass
class SAPOConfig(AlgoConfig):
    name: str = "sapo"
    samples_per_prompt: int = 8  # G, responses per prompt
    loss_agg: str = "seq_mean_token_mean"  # 1/G sum_i 1/|y_i| sum_t (paper)
    tau_pos: float = 1.0  # gate temperature where A > 0 (paper)
    tau_neg: float = 1.05  # gate temperature where A < 0 (paper; > tau_pos)
    kl_coef: float = 0.0  # no KL term in the paper
    eps: float = 1e-6  # added to the group std


def soft_gate_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                        tau_pos: float, tau_neg: float) -> tuple[torch.Tensor, dict]:
    """[B, T] loss -f(r) A with f(r) = sigmoid(tau (r - 1)) 4 / tau, tau by the sign of A (0 at padding), and stats."""
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"SAPO temperatures must be > 0: tau_pos={tau_pos}, tau_neg={tau_neg}")
    adv = advantages.to(logp.dtype)
    if adv.dim() == logp.dim() - 1:
        adv = adv.unsqueeze(-1)
    log_ratio = (logp - old_logp.to(logp.dtype)).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    m = mask.to(logp.dtype)
    loss = torch.where(m != 0, -gate * adv * m, torch.zeros_like(logp))
    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio - 1.0))
        damped = (4.0 * s * (1.0 - s) < 0.5).to(logp.dtype)  # the gate's gradient weight below 1/2
        stats = {"clipfrac": float(ops.masked_mean(damped, m)), "approx_kl": float(ops.masked_mean(-log_ratio, m))}
    return loss, stats


@register_algorithm("sapo", summary="soft sigmoid gate on the token ratio instead of a hard clip, group-normalised advantage (2511.20347)")
class SAPO(GroupAdvantage):
    config_class = SAPOConfig
    metadata = {
        "baseline": "group mean",
        "normalisation": "group std",
        "kl": "none",
        "aggregation": "seq_mean_token_mean (soft gate)",
        "extra models": "none",
        "extra generation": "none",
    }

    def policy_loss(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        return sapo_loss(self, logp, mb)


@register_loss("sapo", "a soft sigmoid gate on the token ratio instead of a clip (2511.20347)", tau_pos=1.0, tau_neg=1.05)
def sapo_loss(algo, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
    b, dev = mb.batch, logp.device
    return soft_gate_surrogate(logp, b.old_logp.to(dev), b.advantages.to(dev), b.response_mask.to(dev),
                               param(algo, "sapo", "tau_pos"), param(algo, "sapo", "tau_neg"))  # fmt: skip
