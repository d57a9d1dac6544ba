"""Clip-Cov: detach the gradient of a few high-covariance tokens.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617 (Section 5).

The paper shows that policy entropy falls, step by step, in proportion to the covariance between
a token's log-probability and its advantage, and that a small fraction of tokens with very high
covariance drives the collapse. Clip-Cov keeps GRPO's objective (group-normalised advantage,
PPO's clipped surrogate) but removes those tokens from the gradient:

    Cov_t = (log pi(y_t) - mean log pi) * (A_t - mean A)                 over the batch's tokens
    I     = r x N tokens drawn uniformly from {t : omega_low <= Cov_t <= omega_high}
    J     = sum_t (1 - 1[t in I]) min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)

with the paper's r = 2e-4, omega_low = 1, omega_high = 5. No KL term.

Deviations: the batch whose covariance is centred and counted is each micro-batch (as in the
authors' implementation: the loss sees one micro-batch at a time); at least one token is drawn
when any qualifies (r x N < 1 at this harness's CPU scale). Tokens already on PPO's clipped
branch are not candidates (their gradient is 0 already). The draw uses the algorithm's own
seeded generator, so runs are reproducible and leave the sampling RNG alone. Aggregation:
``token_mean``; clip range 0.2 both ways (GRPO's; the paper's runs are built on it).
``policy/covfrac`` is the fraction of tokens detached.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, GroupAdvantage, MicroBatch
from algorithms.parts import param, register_loss


@dataclass
class ClipCovConfig(AlgoConfig):
    name: str = "clip_cov"
    samples_per_prompt: int = 8  # G, responses per prompt
    loss_agg: str = "token_mean"
    clip_low: float = 0.2  # PPO's ratio clip, kept
    clip_high: float = 0.2
    kl_coef: float = 0.0  # no KL term
    cov_frac: float = 2e-4  # r: the fraction of tokens detached (paper)
    cov_low: float = 1.0  # omega_low: the covariance band tokens are drawn from (paper)
    cov_high: float = 5.0  # omega_high (paper)
    eps: float = 1e-6  # added to the group std


def clip_cov_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                       clip_low: float, clip_high: float, frac: float, cov_low: float, cov_high: float,
                       generator: torch.Generator | None = None) -> tuple[torch.Tensor, dict]:
    """[B, T] PPO clipped loss with max(1, floor(frac x N)) tokens of covariance in [cov_low, cov_high]
    (drawn uniformly, not already clipped) set to 0, and stats (clipfrac, approx_kl, covfrac)."""
    loss, stats = ops.clipped_surrogate(logp, old_logp, advantages, mask, clip_low, clip_high, return_stats=True)
    with torch.no_grad():
        adv = advantages.to(logp.dtype)
        if adv.dim() == logp.dim() - 1:
            adv = adv.unsqueeze(-1).expand_as(logp)
        ratio = torch.exp((logp.detach() - old_logp.to(logp.dtype)).clamp(-20.0, 20.0))
        on_clip = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high) > -adv * ratio
        cov = ops.token_covariance(logp, adv, mask)
        valid = mask.to(torch.bool)
        candidates = (valid & ~on_clip & (cov >= cov_low) & (cov <= cov_high)).flatten().nonzero().flatten()
        detach = torch.zeros(logp.numel(), dtype=torch.bool, device=logp.device)
        if len(candidates):
            n = min(len(candidates), max(1, int(frac * int(valid.sum()))))
            pick = torch.randperm(len(candidates), generator=generator)[:n].to(candidates.device)
            detach[candidates[pick]] = True
        detach = detach.view_as(logp)
    stats["covfrac"] = float(ops.masked_mean(detach.to(logp.dtype), mask))
    return torch.where(detach, torch.zeros_like(loss), loss), stats


@register_algorithm("clip_cov", summary="GRPO with the gradient of a few high-covariance tokens detached (2505.22617)")
class ClipCov(GroupAdvantage):
    config_class = ClipCovConfig
    extra_stats = ("covfrac",)
    metadata = {
        "baseline": "group mean",
        "normalisation": "group std",
        "kl": "none",
        "aggregation": "token_mean (high-covariance tokens detached)",
        "extra models": "none",
        "extra generation": "none",
    }

    def __init__(self, cfg: ClipCovConfig):
        super().__init__(cfg)
        self._generator = torch.Generator().manual_seed(0)  # reproducible draws, apart from sampling's RNG

    def policy_loss(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        return clip_cov_loss(self, logp, mb)


@register_loss("clip_cov", "PPO clip with the gradient of a few high-covariance tokens detached (2505.22617)",
               clip_low=0.2, clip_high=0.2, cov_frac=2e-4, cov_low=1.0, cov_high=5.0)  # fmt: skip
def clip_cov_loss(algo, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
    b, dev = mb.batch, logp.device
    if getattr(algo, "_generator", None) is None:  # a host algorithm swapping this loss in: its own reproducible draws
        algo._generator = torch.Generator().manual_seed(0)
    p = {k: param(algo, "clip_cov", k) for k in ("clip_low", "clip_high", "cov_frac", "cov_low", "cov_high")}
    return clip_cov_surrogate(logp, b.old_logp.to(dev), b.advantages.to(dev), b.response_mask.to(dev), p["clip_low"],
                              p["clip_high"], p["cov_frac"], p["cov_low"], p["cov_high"], algo._generator)  # fmt: skip
