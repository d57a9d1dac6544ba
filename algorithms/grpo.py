"""GRPO: Group Relative Policy Optimization.

Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
Language Models", arXiv:2402.03300.

Objective (outcome supervision): sample G responses per prompt, score them, and give
every token of response i the advantage

    A_i = (r_i - mean(r_1..G)) / (std(r_1..G) + eps)

then maximise the PPO clipped surrogate with ratio pi_theta / pi_old, minus
beta * KL(pi_theta || pi_ref) estimated per token with k3 (exp(ref - logp) - (ref - logp) - 1)
and added to the loss (not to the reward). The paper averages over tokens of each
response, then over responses (``loss_agg=seq_mean_token_mean``).

Deviations: none by default. ``scale_by_std=false`` drops the std division, and
``loss_agg`` selects another aggregation (see ``dr_grpo`` for the Dr. GRPO variant).
"""

from __future__ import annotations

from dataclasses import dataclass

from algorithms import register_algorithm
from algorithms.base import AlgoConfig, GroupAdvantage


@dataclass
class GRPOConfig(AlgoConfig):
    name: str = "grpo"
    samples_per_prompt: int = 8  # G, responses per prompt
    loss_agg: str = "seq_mean_token_mean"  # paper: mean over tokens, then over responses
    clip_low: float = 0.2  # epsilon
    clip_high: float = 0.2  # epsilon (symmetric in the paper)
    kl_coef: float = 0.04  # beta, the paper's value
    kl_kind: str = "k3"  # the paper's unbiased, non-negative estimator
    scale_by_std: bool = True  # divide by the group std (False: Dr. GRPO's fix)
    eps: float = 1e-6  # added to the group std


@register_algorithm("grpo", summary="group-normalised outcome advantage, clipped surrogate, k3 KL loss (2402.03300)")
class GRPO(GroupAdvantage):
    config_class = GRPOConfig
    metadata = {
        "baseline": "group mean",
        "normalisation": "group std",
        "kl": "k3 loss term",
        "aggregation": "seq_mean_token_mean",
        "extra models": "reference (if kl_coef > 0)",
        "extra generation": "none",
    }


    def describe(self) -> dict[str, str]:
        described = super().describe()
        if "advantage" in described:  # a swapped-in advantage: its own normalisation
            return described
        return {**described, "normalisation": "group std" if self.cfg.scale_by_std else "none"}
