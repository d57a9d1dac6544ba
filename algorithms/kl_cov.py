"""KL-Cov: a KL penalty on the highest-covariance tokens only.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617 (Section 5).

Like Clip-Cov (algorithms/clip_cov.py), aimed at the few tokens whose log-probability /
advantage covariance drives entropy collapse; instead of detaching them, it penalises their
move away from the behaviour policy. GRPO's advantage and the unclipped surrogate elsewhere:

    Cov_t = (log pi(y_t) - mean log pi) * (A_t - mean A)                 over the batch's tokens
    I     = the k x N tokens with the largest Cov_t
    L_t   = -rho_t A_t + beta |log pi(y_t) - log pi_old(y_t)| 1[t in I],   rho_t = pi / pi_old

with the paper's k = 2e-3 (its 7B setting) and beta = 1. No ratio clip and no KL to a reference.

Deviations: the batch is each micro-batch (as in the authors' implementation); at least one
token is penalised (k x N < 1 at this harness's CPU scale). Aggregation ``token_mean``.
``policy/covfrac`` is the fraction of tokens penalised; ``policy/clipfrac`` is 0 (no clip).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, GroupAdvantage, MicroBatch
from algorithms.parts import param, register_loss


@dataclass
class KLCovConfig(AlgoConfig):
    name: str = "kl_cov"
    samples_per_prompt: int = 8  # G, responses per prompt
    loss_agg: str = "token_mean"
    kl_coef: float = 0.0  # no KL to a reference
    cov_frac: float = 2e-3  # k: the fraction of tokens penalised (paper, 7B)
    cov_kl_coef: float = 1.0  # beta: weight of |log pi - log pi_old| on them (paper)
    eps: float = 1e-6  # added to the group std


def kl_cov_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     frac: float, coef: float) -> tuple[torch.Tensor, dict]:
    """[B, T] loss -rho A, plus coef |log rho| at the max(1, floor(frac x N)) highest-covariance valid tokens
    (0 at padding), and stats (clipfrac 0, approx_kl, covfrac)."""
    adv = advantages.to(logp.dtype)
    if adv.dim() == logp.dim() - 1:
        adv = adv.unsqueeze(-1)
    log_ratio = (logp - old_logp.to(logp.dtype)).clamp(-20.0, 20.0)
    loss = -adv * torch.exp(log_ratio)
    m = mask.to(logp.dtype)
    valid = m != 0
    penalised = torch.zeros_like(valid)
    n_valid = int(valid.sum())
    if n_valid:
        cov = ops.token_covariance(logp, adv, mask).masked_fill(~valid, float("-inf"))
        k = min(n_valid, max(1, int(frac * n_valid)))
        penalised.view(-1)[torch.topk(cov.flatten(), k).indices] = True
        loss = loss + coef * log_ratio.abs() * penalised.to(logp.dtype)
    loss = torch.where(valid, loss * m, torch.zeros_like(loss))
    stats = {"clipfrac": 0.0, "approx_kl": float(ops.masked_mean(-log_ratio.detach(), m)),
             "covfrac": float(ops.masked_mean(penalised.to(logp.dtype), m))}
    return loss, stats


@register_algorithm("kl_cov", summary="GRPO advantage, unclipped surrogate, |log-ratio| penalty on the top-covariance tokens (2505.22617)")
class KLCov(GroupAdvantage):
    config_class = KLCovConfig
    extra_stats = ("covfrac",)
    metadata = {
        "baseline": "group mean",
        "normalisation": "group std",
        "kl": "|log ratio| on top-covariance tokens",
        "aggregation": "token_mean (no clip)",
        "extra models": "none",
        "extra generation": "none",
    }

    def policy_loss(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        return kl_cov_loss(self, logp, mb)


@register_loss("kl_cov", "unclipped surrogate, |log-ratio| penalty on the top-covariance tokens (2505.22617)",
               cov_frac=2e-3, cov_kl_coef=1.0)  # fmt: skip
def kl_cov_loss(algo, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
    b, dev = mb.batch, logp.device
    return kl_cov_surrogate(logp, b.old_logp.to(dev), b.advantages.to(dev), b.response_mask.to(dev),
                            param(algo, "kl_cov", "cov_frac"), param(algo, "kl_cov", "cov_kl_coef"))  # fmt: skip
