"""Dr. GRPO: GRPO Done Right.

Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
arXiv:2503.20783.

Objective: GRPO's clipped surrogate with two normalisations removed, both of which
the paper shows bias the optimisation:

    A_i = r_i - mean(r_1..G)                       (no division by the group std)
    J   = 1/G sum_i 1/L_max sum_t min(rho_t A_i, clip(rho_t, 1 - eps, 1 + eps) A_i)

i.e. per-response token *sums* divided by a constant L_max (the generation budget,
``rollout.max_response_tokens``, handed to the loss as ``MicroBatch.max_response_tokens``)
instead of by each response's own length (``loss_agg=seq_mean_token_sum_norm``). The
std division up-weights too-easy/too-hard prompts; the 1/|o_i| factor makes long
wrong answers cheap. The paper also drops the KL term (beta = 0) for rule-based rewards.

Deviations: none by default. Everything else (clip 0.2, k3 KL if ``kl_coef > 0``) is GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass

from algorithms import register_algorithm
from algorithms.grpo import GRPO, GRPOConfig


@dataclass
class DrGRPOConfig(GRPOConfig):
    name: str = "dr_grpo"
    loss_agg: str = "seq_mean_token_sum_norm"  # token sums / constant L_max, then mean over responses
    kl_coef: float = 0.0  # the paper removes the KL term (no reference model)
    scale_by_std: bool = False  # mean-centred advantage only


@register_algorithm("dr_grpo", summary="GRPO without std and length normalisation, no KL (2503.20783)")
class DrGRPO(GRPO):
    config_class = DrGRPOConfig
    metadata = {
        "baseline": "group mean",
        "normalisation": "none",
        "kl": "none (k3 loss term if kl_coef > 0)",
        "aggregation": "seq_mean_token_sum_norm (/ max response tokens)",
        "extra models": "none (reference if kl_coef > 0)",
        "extra generation": "none",
    }
