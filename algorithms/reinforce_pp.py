"""REINFORCE++ and REINFORCE++-baseline.

Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
Models" (later: "... Robustness to Both Prompt and Reward Models"), arXiv:2501.03262.

Objective (``reinforce_pp``): critic-free PPO. The KL to the reference is a per-token
reward and the outcome score arrives at the last token:

    r_t = -kl_coef * k1_t  (+ score at the last response token),
    k1_t = log pi_old(y_t) - log pi_ref(y_t)
    G_t = r_t + gamma * G_{t+1}                    (discounted return, gamma = 1)
    A_t = (G_t - mean(G)) / std(G)                 (whitened over all tokens of the batch)

then the PPO clipped surrogate (eps = 0.2) averaged over tokens.

``reinforce_pp_baseline`` (for outcome rewards with several samples per prompt, as
OpenRLHF's ``reinforce_baseline`` estimator): the group mean is subtracted from the
score first (R_i - mean(R_group)), then the same token KL, discounted return and
global whitening. The group baseline removes the per-prompt difficulty; the global
(not per-group) std avoids GRPO's over-weighting of near-uniform groups.

Conventions and deviations: the batch-wide whitening uses all valid tokens of the
step's batch (``ops.masked_whiten``, unbiased variance), computed once before the
update rather than per minibatch. When ``kl_coef > 0`` the engine builds the reference
model and computes old/ref log-probs before the advantages (``logp_before_advantages``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, Algorithm, Batch
from algorithms.parts import param, register_advantage


@dataclass
class ReinforcePPConfig(AlgoConfig):
    name: str = "reinforce_pp"
    samples_per_prompt: int = 8  # responses per prompt (REINFORCE++ also works with 1)
    loss_agg: str = "token_mean"  # mean over all tokens of the minibatch
    clip_low: float = 0.2  # PPO epsilon
    clip_high: float = 0.2  # PPO epsilon
    kl_coef: float = 0.001  # beta of the per-token KL reward (0 = no reference model)
    kl_kind: str = "k1"  # the paper's per-token estimator log(pi_old / pi_ref)
    gamma: float = 1.0  # discount of the token-level return


@register_algorithm("reinforce_pp", summary="REINFORCE++: token KL in reward, global advantage whitening (2501.03262)")
class ReinforcePP(Algorithm):
    config_class = ReinforcePPConfig
    kl_placement = "reward"
    group_baseline = False
    metadata = {
        "baseline": "none (global whitening)",
        "normalisation": "batch mean/std over tokens",
        "kl": "k1 per-token reward",
        "aggregation": "token_mean",
        "extra models": "reference (if kl_coef > 0)",
        "extra generation": "none",
    }

    def outcome(self, batch: Batch) -> torch.Tensor:
        return batch.scores.float()

    def token_rewards(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.response_mask
        rewards = ops.outcome_at_last_token(self.outcome(batch), mask)
        if self.cfg.kl_coef <= 0:
            return rewards, {}
        kl, metrics = self.kl_in_reward(batch)
        return rewards - self.cfg.kl_coef * kl, metrics

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.response_mask
        batch.token_rewards, metrics = self.token_rewards(batch)
        batch.returns = ops.discounted_returns(batch.token_rewards, mask, self.cfg.gamma)
        return ops.masked_whiten(batch.returns, mask) * mask, metrics


@dataclass
class ReinforcePPBaselineConfig(ReinforcePPConfig):
    name: str = "reinforce_pp_baseline"


@register_algorithm(
    "reinforce_pp_baseline", summary="REINFORCE++ with group-mean baseline, then global whitening (2501.03262)"
)
class ReinforcePPBaseline(ReinforcePP):
    config_class = ReinforcePPBaselineConfig
    metadata = {**ReinforcePP.metadata, "baseline": "group mean (then global whitening)"}

    def outcome(self, batch: Batch) -> torch.Tensor:
        return ops.group_normalized_advantage(batch.scores.float(), batch.group_ids, scale_by_std=False)


@register_advantage("batch_norm", "the outcome's discounted return at every token, whitened over the batch "
                    "(REINFORCE++, 2501.03262)", gamma=1.0)  # fmt: skip
def batch_norm_advantage(algo: Algorithm, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    mask = batch.response_mask
    batch.returns = ops.discounted_returns(ops.outcome_at_last_token(batch.scores.float(), mask), mask,
                                           param(algo, "batch_norm", "gamma"))  # fmt: skip
    return ops.masked_whiten(batch.returns, mask) * mask, {}
