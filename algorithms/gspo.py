"""GSPO: Group Sequence Policy Optimization.

Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071.

Objective: GRPO's group-normalised advantage, but the importance ratio and its clipping
are per *sequence*, with the length-normalised likelihood ratio

    s_i = (pi(y_i|x) / pi_old(y_i|x)) ^ (1/|y_i|) = exp(1/|y_i| sum_t (logp_t - old_logp_t))
    J   = 1/G sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

with much smaller clip ranges than token-level PPO (the paper: 3e-4 / 4e-4). No KL term.

Implementation: the per-token "GSPO-token" form of the paper,
s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)], whose value is s_i at every token and whose
gradient is s_i grad log pi(y_t). Fed to the shared clipped surrogate and averaged per
response then over responses (``seq_mean_token_mean``), its gradient is exactly the
sequence-level GSPO gradient s_i A_i 1/|y_i| sum_t grad log pi(y_t). ``policy/clipfrac``
is then the token-weighted fraction of clipped sequences.

Deviations: none by default (``kl_coef`` > 0 adds GRPO's KL loss term, ``entropy_coef``
an entropy bonus, both outside the paper).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, GroupAdvantage, MicroBatch
from algorithms.parts import param, register_loss


@dataclass
class GSPOConfig(AlgoConfig):
    name: str = "gspo"
    samples_per_prompt: int = 8  # G, responses per prompt
    loss_agg: str = "seq_mean_token_mean"  # = sequence-level objective averaged over responses
    clip_low: float = 3e-4  # eps_low on the sequence ratio (paper)
    clip_high: float = 4e-4  # eps_high on the sequence ratio (paper)
    kl_coef: float = 0.0  # no KL term in the paper
    eps: float = 1e-6  # added to the group std


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] log s_i,t = sg[log s_i] + logp_t - sg[logp_t] with log s_i the mean token log-ratio."""
    log_s = ops.masked_mean(logp.detach() - old_logp.to(logp.dtype), mask, dim=-1)
    return log_s[:, None] + logp - logp.detach()


@register_algorithm("gspo", summary="sequence-level clipped importance ratio, group-normalised advantage (2507.18071)")
class GSPO(GroupAdvantage):
    config_class = GSPOConfig
    metadata = {
        "baseline": "group mean",
        "normalisation": "group std",
        "kl": "none",
        "aggregation": "seq_mean_token_mean (sequence ratio)",
        "extra models": "none",
        "extra generation": "none",
    }


    def policy_loss(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        return gspo_loss(self, logp, mb)


@register_loss("gspo", "PPO clip on the sequence ratio, the geometric mean of token ratios (2507.18071)",
               clip_low=3e-4, clip_high=4e-4)  # fmt: skip
def gspo_loss(algo, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
    b, dev = mb.batch, logp.device
    mask = b.response_mask.to(dev)
    seq_logp = sequence_log_ratio(logp, b.old_logp.to(dev), mask)
    return ops.clipped_surrogate(
        seq_logp, torch.zeros_like(logp), b.advantages.to(dev), mask, param(algo, "gspo", "clip_low"),
        param(algo, "gspo", "clip_high"), return_stats=True,
    )
