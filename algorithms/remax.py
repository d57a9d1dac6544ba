"""ReMax: REINFORCE with the greedy response's reward as the baseline.

Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
Method for Aligning Large Language Models", arXiv:2310.10505.

Objective: for each prompt, sample a response y ~ pi and decode a greedy response
y_bar; every token of y gets the advantage r(y) - r(y_bar) (no normalisation) in a
REINFORCE loss. ``select`` generates the greedy responses through the loop's sampler
(temperature 0), which scores them and counts their tokens in the budget.

Deviations: 8 sampled responses per prompt by default (the paper samples one), all
sharing the prompt's greedy baseline: comparisons with the group methods then run at equal
sequences per step, and on the tiny arith task one sample per prompt (32 sequences per
step at lr 3e-4) drifted and lost accuracy (0.117 -> 0.008). The loss is the shared clipped surrogate; with one optimizer step per
batch (the default) its ratio is exactly 1, which is the plain REINFORCE gradient.
An optional k1 KL penalty can be folded into the reward (``kl_coef``, off by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import register_algorithm
from algorithms.base import AlgoConfig, Algorithm, Batch, Sampler
from algorithms.parts import register_advantage


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
    makes_greedy_baseline = True  # select() puts the greedy response's score in batch.outputs["greedy_score"]
    kl_placement = "reward"
    metadata = {
        "baseline": "greedy response reward",
        "normalisation": "none",
        "kl": "k1 in the reward (optional)",
        "aggregation": "seq_mean_token_sum",
        "extra models": "reference (if kl_coef > 0)",
        "extra generation": "+1 greedy response per prompt",
    }

    def select(self, batch: Batch, sampler: Sampler) -> tuple[Batch, dict[str, float]]:
        """One greedy response per prompt; its score, broadcast to the prompt's samples, goes to
        ``batch.outputs["greedy_score"]``."""
        groups = batch.group_ids.tolist()
        first = {g: i for i, g in reversed(list(enumerate(groups)))}  # each group's first row
        order = sorted(first)
        prompts, truths = [batch.prompts[first[g]] for g in order], [batch.ground_truths[first[g]] for g in order]
        greedy = sampler.generate(prompts, truths, n=1, temperature=0.0)
        by_group = dict(zip(order, greedy.scores.tolist()))
        batch.outputs["greedy_score"] = torch.tensor([by_group[g] for g in groups], dtype=torch.float32)
        return batch, {}

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        reward, baseline, metrics = batch.scores, batch.outputs["greedy_score"], {}
        if self.cfg.kl_coef > 0:
            kl, metrics = self.kl_in_reward(batch)
            reward = reward - self.cfg.kl_coef * kl.sum(-1)
        metrics["remax/greedy_reward"] = float(baseline.mean())
        return (reward - baseline)[:, None] * batch.response_mask, metrics


@register_advantage("greedy", "the score minus the greedy response's score to the same prompt (ReMax, 2310.10505)",
                    needs_greedy=True)  # fmt: skip
def greedy_advantage(algo: Algorithm, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    baseline = batch.outputs["greedy_score"]
    return (batch.scores - baseline)[:, None] * batch.response_mask, {"remax/greedy_reward": float(baseline.mean())}
