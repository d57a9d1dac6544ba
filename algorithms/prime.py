"""PRIME: Process Reinforcement through IMplicit rEwards.

Cui et al. 2025, "Process Reinforcement through Implicit Rewards", arXiv:2502.01456;
implicit PRM: Yuan et al. 2024, "Free Process Rewards without Process Labels",
arXiv:2412.01981.

Objective: an implicit PRM pi_phi (a causal LM initialised from the policy) and a
frozen reference pi_ref give dense token rewards

    d_t = beta * (log pi_phi(y_t | y_<t) - log pi_ref(y_t | y_<t)).

The PRM is trained online with cross-entropy between sigma(beta * sum_t (log pi_phi -
log pi_ref)) and the verifier outcome. Advantages (eq. 5 of the paper): leave-one-out
baselines within each prompt's K samples, separately for the dense rewards (baseline:
mean of the other samples' summed dense reward) and for the outcome reward; the two are
combined with their coefficients into token rewards, turned into returns (gamma) and
whitened over the batch. The policy minimises the PPO clipped surrogate. Prompts whose
sample accuracy lies outside [acc_low, acc_high] are filtered out and replaced by
fresh samples (oversampling), as in the paper's online prompt filter.

Deviations: (1) the dense-reward baseline is per token: every token's reward has the other
samples' mean per-token implicit reward subtracted, so returns carry no length bias when all
tokens score alike. (Subtracting the other samples' summed reward once, at the last token,
made the last token's return -baseline: with mostly-wrong samples the PRM's rewards are
negative, so ending early was rewarded and arith runs collapsed to 1-token answers.) (2) token rewards come from the PRM
*before* its update on the current batch (saves one forward pass per step);
(3) oversampling regenerates up to ``extra_sampling_rounds`` extra times instead of sampling a
fixed larger batch up front; when the rounds run out, filtered groups pad the batch (fixed
shapes) with zero advantage in the policy loss. (4) ``prm_on_filtered``: the PRM also
learns from those padding groups (the paper trains it on kept prompts only), so it sees the
all-wrong answers a collapsing policy produces. (5) ``prm_lr_scale`` = 0.1: the PRM learns at
a tenth of the policy's rate (the paper: twice, at lr 5e-7); at lr 3e-4 a PRM as fast as the
policy gave large, noisy per-token rewards that swamped the outcome signal.

Measured at the quick setting (arith, tiny model, 80k generated tokens, 32 prompts/step, one
thread; final greedy eval of seeds 0-4, start 0.117): paper behaviour (PRM on kept groups, PRM
lr = policy lr): 0.063 0.000 0.055 0.000 0.164 (two seeds collapse to EOS-only answers, two
more end below the start); with (4): 0.188 0.078 0.055 0.180 0.117; with (4) and (5), the
defaults: 0.117 0.156 0.266 0.164 0.211 -- every seed's last three evals average above the
start (+0.02 to +0.10) and responses stay >= 3.2 tokens long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from algorithms import ops, register_algorithm
from algorithms.base import REFERENCE, AlgoConfig, Algorithm, Batch, MicroBatch, Needs, Role, Sampler
from algorithms.parts import param, register_advantage, register_filter
from algorithms.sampling import refill_groups


@dataclass
class PRIMEConfig(AlgoConfig):
    name: str = "prime"
    samples_per_prompt: int = 4  # K in the paper
    loss_agg: str = "token_mean"
    beta: float = 0.05  # implicit PRM temperature
    dense_coef: float = 1.0  # weight of the leave-one-out dense (process) rewards
    outcome_coef: float = 1.0  # weight of the leave-one-out verifier reward
    gamma: float = 1.0  # discount of the returns
    acc_low: float = 0.2  # keep prompts whose sample accuracy is >= this ...
    acc_high: float = 0.8  # ... and <= this
    extra_sampling_rounds: int = 2  # extra generation rounds to refill filtered prompts (0 = none), as DAPO's
    prm_lr: float = 0.0  # PRM learning rate; 0 = prm_lr_scale x trainer.lr
    prm_lr_scale: float = 0.1  # PRM lr relative to the policy's when prm_lr = 0 (the paper: 2; see Deviations)
    prm_on_filtered: bool = True  # the PRM also learns from groups the filter rejected (deviation 4); False = paper
    filter: str = "accuracy"  # the accuracy filter below (algorithms/parts.py hooks)


@register_algorithm("prime", summary="implicit PRM dense rewards + RLOO, online PRM update, accuracy filter (2502.01456)")
class PRIME(Algorithm):
    config_class = PRIMEConfig
    learns_from_verdicts = True  # the implicit PRM's labels and the accuracy filter are the checker's verdicts
    metadata = {
        "baseline": "leave-one-out (dense and outcome)",
        "normalisation": "batch whitening",
        "kl": "none",
        "aggregation": "token_mean",
        "extra models": "implicit PRM (trained) + reference",
        "extra generation": "refills filtered prompts (<= extra_sampling_rounds extra batches)",
    }

    @property
    def needs(self) -> Needs:
        # The implicit PRM: a causal LM initialised from the policy, trained online.
        prm = Role("prm", trainable=True, lr=self.cfg.prm_lr or None, lr_scale=self.cfg.prm_lr_scale, loss=self.prm_loss)
        return Needs(roles=(REFERENCE, prm))

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        return implicit_prm_advantage(self, batch)

    def prm_loss(self, prm_logp: torch.Tensor, _entropy: Any, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        """Cross-entropy of sigma(beta * sum_t log-ratio) against the verifier outcome."""
        b, dev = mb.batch, prm_logp.device
        mask = b.response_mask.to(dev).float()
        logit = self.cfg.beta * ((prm_logp - b.ref_logp.to(dev)) * mask).sum(-1)
        label = b.correct.to(dev).float()
        kept = torch.ones(len(b), device=dev)
        if not self.cfg.prm_on_filtered:
            kept = b.kept().to(dev).float()
        loss = (F.binary_cross_entropy_with_logits(logit, label, reduction="none") * kept).sum() / mb.minibatch_seqs
        acc = float(((logit > 0).float() == label).float().mean())
        return loss, {"prm/loss": float(loss.detach()) * mb.minibatch_seqs / len(b), "prm/accuracy": acc}


@register_advantage("implicit_prm", "leave-one-out dense implicit-PRM rewards + leave-one-out outcome, discounted "
                    "returns, whitened (PRIME, 2502.01456)", needs_role="prm", beta=0.05, dense_coef=1.0,
                    outcome_coef=1.0, gamma=1.0)  # fmt: skip
def implicit_prm_advantage(algo: Algorithm, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    mask = batch.response_mask.float()
    beta, dense_coef, outcome_coef, gamma = (param(algo, "implicit_prm", k) for k in ("beta", "dense_coef",
                                                                                   "outcome_coef", "gamma"))
    dense = beta * (batch.outputs["prm"] - batch.ref_logp) * mask  # [B, T]
    last = ops.last_token_mask(batch.response_mask).float()
    # Leave-one-out baselines, x_i - b_i with b_i = mean_{j != i} x_j. The dense baseline is
    # the other samples' mean *per-token* reward, subtracted from every token (see Deviations).
    per_token = dense.sum(-1) / mask.sum(-1).clamp(min=1)
    dense_baseline = per_token - ops.leave_one_out_advantage(per_token, batch.group_ids)
    outcome_loo = ops.leave_one_out_advantage(batch.scores, batch.group_ids)
    token_rewards = dense_coef * (dense - dense_baseline[:, None] * mask) + outcome_coef * outcome_loo[:, None] * last
    batch.token_rewards = token_rewards
    returns = ops.discounted_returns(token_rewards, mask, gamma)
    batch.returns = returns
    # Filtered-out groups used only as filler (see PRIME.select) get no weight.
    kept = mask * batch.kept()[:, None]
    if int(kept.sum()) > 1:
        returns = ops.masked_whiten(returns, kept)
    return returns * kept, {"prime/dense_reward_mean": float(dense.sum(-1).mean())}


@register_filter("accuracy", "keep the groups whose sample accuracy is within [acc_low, acc_high], refill from fresh "
                 "prompts (PRIME, 2502.01456)", acc_low=0.2, acc_high=0.8, extra_sampling_rounds=2)  # fmt: skip
def accuracy_filter(algo: Algorithm, batch: Batch, sampler: Sampler) -> tuple[Batch, dict[str, float]]:
    lo, hi = param(algo, "accuracy", "acc_low"), param(algo, "accuracy", "acc_high")
    rounds = 1 + int(param(algo, "accuracy", "extra_sampling_rounds"))
    return refill_groups(batch, lambda s: lo <= float((s > 0.5).float().mean()) <= hi, sampler.more, rounds, "prime")
