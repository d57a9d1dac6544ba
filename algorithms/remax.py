"""ReMax: REINFORCE with the greedy response's reward as the baseline.

Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
Method for Aligning Large Language Models", arXiv:2310.10505.

Objective: for each prompt, sample a response y ~ pi and decode a greedy response
y_bar; every token of y gets the advantage r(y) - r(y_bar) (no normalisation) in a
REINFORCE loss. The greedy rollout is declared in ``needs`` (greedy_baseline), so the
engine runs that extra generation pass and counts its tokens in the budget.

Deviations: 8 sampled responses per prompt by default (the paper samples one), all
sharing the prompt's greedy baseline: comparisons with the group methods then run at equal
sequences per step, and on the tiny arith task one sample per prompt (32 sequences per
step at lr 3e-4) drifted and lost accuracy (0.117 -> 0.008). The loss is the shared clipped surrogate; with one optimizer step per
batch (the default) its ratio is exactly 1, which is the plain REINFORCE gradient.
An optional k1 KL penalty can be folded into the reward (``kl_coef``, off by default).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, Algorithm, Batch, Needs


@dataclass
class ReMaxConfig(AlgoConfig):
    name: str = "remax"
    samples_per_prompt: int = 8  # the paper samples one (+ one greedy); see Deviations
    loss_agg: str = "seq_mean_token_sum"  # REINFORCE: sum of token log-probs per sequence
    kl_coef: float = 0.0  # beta of an optional k1 KL penalty in the sequence reward
    kl_kind: str = "k1"


@register_algorithm("remax", summary="REINFORCE with the greedy response's reward as baseline (2310.10505)")
class ReMax(Algorithm):
    config_class = ReMaxConfig
    kl_placement = "reward"
    metadata = {
        "baseline": "greedy response reward",
        "normalisation": "none",
        "kl": "k1 in the reward (optional)",
        "aggregation": "seq_mean_token_sum",
        "extra models": "reference (if kl_coef > 0)",
        "extra generation": "+1 greedy response per prompt",
    }

    @property
    def needs(self) -> Needs:
        return replace(super().needs, greedy_baseline=True)

    def advantages(self, batch: Batch) -> torch.Tensor:
        reward = batch.scores
        if self.cfg.kl_coef > 0:
            kl = ops.reward_kl(batch.old_logp, batch.ref_logp, batch.response_mask, self.cfg.kl_kind)
            reward = reward - self.cfg.kl_coef * kl.sum(-1)
            batch.extra["metrics"] = {**batch.extra.get("metrics", {}), "reward/kl": float(ops.masked_mean(kl, batch.response_mask))}
        adv = reward - batch.greedy_scores
        batch.extra["metrics"] = {**batch.extra.get("metrics", {}), "remax/greedy_reward": float(batch.greedy_scores.mean())}
        return adv[:, None] * batch.response_mask
