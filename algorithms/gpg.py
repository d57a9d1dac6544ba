"""GPG: Group Policy Gradient.

Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
Reasoning", arXiv:2504.02546.

Objective: the plain policy gradient, with no surrogate ratio, no clipping, no critic, no
reference model and no KL term:

    J = 1 / sum_i |y_i| * sum_i sum_t alpha * A_i * log pi(y_i,t)

with the group-mean baseline A_i = (r_i - mean(r_group)) / F_norm (F_norm = 1, the paper's
default: no std division) and the paper's gradient correction

    alpha = B / (B - M)

where B is the number of responses in the batch and M the number of them whose group's rewards
are all equal (their advantage is 0, so they add nothing to the gradient but count in the mean):
alpha rescales the batch's gradient to the responses that carry a signal. A batch in which every
group is uniform has no signal; there alpha = 1 (every advantage is 0 anyway).

Deviations: none in the loss. verl's GPG divides by the number of non-zero *rewards* instead of
the responses with a signal (B / #(r != 0)); this follows the paper's definition. The paper's
optional threshold filtering (skipping batches with too few valid responses) is not
implemented. ``std_norm=true`` divides by the group std (F_norm = std, the paper's option).
One update per batch (epochs 1), so the policy that sampled is the one differentiated and
``policy/approx_kl`` is 0 up to numerics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, Algorithm, Batch, MicroBatch
from algorithms.parts import param, register_advantage, register_loss


@dataclass
class GPGConfig(AlgoConfig):
    name: str = "gpg"
    samples_per_prompt: int = 8  # G, responses per prompt
    loss_agg: str = "token_mean"  # 1 / sum_i |y_i| (paper)
    kl_coef: float = 0.0  # no reference model, no KL (paper)
    std_norm: bool = False  # F_norm = 1 (paper default); True: the group std
    eps: float = 1e-6  # added to the group std when std_norm


def gpg_advantage(scores: torch.Tensor, group_ids, std_norm: bool = False, eps: float = 1e-6) -> tuple[torch.Tensor, float]:
    """([B] alpha * A_i, alpha): the group-mean advantage (divided by the group std when ``std_norm``),
    scaled by alpha = B / (B - M), M the responses in groups whose rewards are all equal."""
    adv = ops.group_normalized_advantage(scores, group_ids, eps=eps, scale_by_std=std_norm)
    with_signal = int((~ops.uniform_group_rows(scores, group_ids)).sum())  # a group of 1 keeps its raw score
    alpha = len(adv) / with_signal if with_signal else 1.0
    return alpha * adv, alpha


def policy_gradient_loss(logp: torch.Tensor, old_logp: torch.Tensor | None, advantages: torch.Tensor,
                         mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """[B, T] loss -A_t log pi(y_t) (0 at padding), and stats (no clipping: clipfrac 0)."""
    adv = advantages.to(logp.dtype)
    if adv.dim() == logp.dim() - 1:
        adv = adv.unsqueeze(-1)
    m = mask.to(logp.dtype)
    loss = torch.where(m != 0, -adv * logp * m, torch.zeros_like(logp))
    kl = 0.0 if old_logp is None else float(ops.masked_mean(old_logp.to(logp.dtype) - logp.detach(), m))
    return loss, {"clipfrac": 0.0, "approx_kl": kl}


@register_algorithm("gpg", summary="plain policy gradient, group-mean baseline, alpha = B/(B-M) correction, no KL (2504.02546)")
class GPG(Algorithm):
    config_class = GPGConfig
    metadata = {
        "baseline": "group mean",
        "normalisation": "alpha = B/(B-M)",
        "kl": "none",
        "aggregation": "token_mean (no ratio, no clip)",
        "extra models": "none",
        "extra generation": "none",
    }

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        return gpg_advantage_part(self, batch)

    def policy_loss(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        return pg_loss(self, logp, mb)

    def describe(self) -> dict[str, str]:
        described = super().describe()
        if "advantage" in described:  # a swapped-in advantage: its own normalisation
            return described
        return {**described, "normalisation": "group std, alpha" if self.cfg.std_norm else "alpha = B/(B-M)"}


@register_advantage("gpg", "group mean (std with std_norm), scaled by alpha = B / (B - M) (2504.02546)",
                    needs_group=True, std_norm=False, eps=1e-6)  # fmt: skip
def gpg_advantage_part(algo: Algorithm, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    adv, alpha = gpg_advantage(batch.scores, batch.group_ids, std_norm=param(algo, "gpg", "std_norm"),
                               eps=param(algo, "gpg", "eps"))  # fmt: skip
    return adv[:, None] * batch.response_mask, {"adv/gpg_alpha": alpha}


@register_loss("pg", "plain policy gradient -A log pi, no ratio, no clip (GPG, 2504.02546)")
def pg_loss(algo: Algorithm, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
    b, dev = mb.batch, logp.device
    old = None if b.old_logp is None else b.old_logp.to(dev)
    return policy_gradient_loss(logp, old, b.advantages.to(dev), b.response_mask.to(dev))
