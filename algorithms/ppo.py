"""PPO for language models, with a learned critic and GAE.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv:1707.06347;
GAE: Schulman et al. 2015, arXiv:1506.02438; KL-shaped reward and the adaptive KL
controller: Ziegler et al. 2019, arXiv:1909.08593; the LLM recipe: Ouyang et al. 2022
(InstructGPT), arXiv:2203.02155. Dual clip: Ye et al. 2020, arXiv:1912.09729.

Objective: token rewards r_t = -beta * KL_t (k1 of the behaviour vs reference policy)
plus the verifier score on the last response token; a critic V (the policy's body with
a scalar head) gives GAE advantages (gamma, lambda), whitened over the batch. The
policy minimises the clipped surrogate (dual clip c for negative advantages) for
``epochs`` passes over the batch; the critic minimises the clipped value loss against
the GAE returns. beta is fixed, or adapted towards ``kl_target`` (Ziegler et al.).
With ``critic_warmup`` = N the first N RL steps train the critic only (verl's
``trainer.critic_warmup``): an untrained value head's GAE baseline is noise, and the policy
then moves on advantages that are mostly the critic's error.

Deviations: the critic is a separate FSDP model initialised from the policy's weights
(not from a reward model, which verifiable rewards do not need). Defaults: 8 samples per
prompt (InstructGPT samples one) and 2 epochs (the usual 4): comparisons with the group
methods then run at equal sequences per step, and on the tiny arith task (lr 3e-4, 32
prompts/step) 1 sample x 4 epochs, or 4 samples x 2 epochs, drifted from the warm start
and lost accuracy (0.117 -> 0.016 and 0.078 greedy), while 8 x 2 rose to 0.242 in 100 steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, Algorithm, Batch, MicroBatch, Needs, Role
from algorithms.parts import param, register_advantage


@dataclass
class PPOConfig(AlgoConfig):
    name: str = "ppo"
    samples_per_prompt: int = 8  # as the group methods (equal sequences per step; see Deviations)
    epochs: int = 2  # passes over each batch (the ratio moves after the first optimizer step)
    loss_agg: str = "token_mean"
    clip_low: float = 0.2  # epsilon
    clip_high: float = 0.2
    dual_clip: float = 3.0  # c of the dual clip (bounds negative-advantage losses)
    kl_coef: float = 0.001  # beta of the KL penalty folded into the token reward (0 = no reference)
    kl_kind: str = "k1"  # estimator of the per-token KL in the reward
    kl_adaptive: bool = False  # adapt beta towards kl_target (Ziegler et al. 2019)
    kl_target: float = 6.0  # target summed KL per response for the adaptive controller
    kl_horizon: int = 10000  # controller horizon, in sequences
    gamma: float = 1.0  # discount
    lam: float = 0.95  # GAE lambda
    value_clip: float = 0.5  # clip range of the value loss
    critic_lr: float = 0.0  # critic learning rate (0 = trainer.lr)
    # RL steps at the start in which only the critic trains, on the start's rollouts, before the policy
    # moves (verl's trainer.critic_warmup); their tokens count in the budget like any other step's.
    critic_warmup: int = 0
    whiten_advantages: bool = True  # normalise advantages over the batch


@register_algorithm("ppo", summary="critic + GAE, KL in the reward, clipped surrogate with dual clip (1707.06347)")
class PPO(Algorithm):
    config_class = PPOConfig
    kl_placement = "reward"
    metadata = {
        "baseline": "learned critic (GAE)",
        "normalisation": "batch whitening",
        "kl": "k1 in the token reward",
        "aggregation": "token_mean",
        "extra models": "critic (+ reference if kl_coef > 0)",
        "extra generation": "none",
    }

    def __init__(self, cfg: PPOConfig):
        super().__init__(cfg)
        self.beta = cfg.kl_coef  # current KL coefficient (changes when adaptive)

    @property
    def needs(self) -> Needs:
        critic = Role("critic", head="scalar", trainable=True, lr=self.cfg.critic_lr or None, loss=self.critic_loss,
                      epochs=self.cfg.epochs)  # fmt: skip
        base = super().needs
        return replace(base, roles=(*base.roles, critic))

    def trains_policy(self, step: int) -> bool:
        return step > self.cfg.critic_warmup

    def token_rewards(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """-beta * KL_t on every token, plus the score on the last valid token; and metrics."""
        mask = batch.response_mask
        rewards = ops.outcome_at_last_token(batch.scores.float(), mask)
        if self.cfg.kl_coef <= 0:
            return rewards, {}
        kl, metrics = self.kl_in_reward(batch)
        metrics["ppo/kl_coef"] = self.beta
        rewards = rewards - self.beta * kl
        self._adapt(float((kl.sum(-1)).mean()), len(batch))
        return rewards, metrics

    def _adapt(self, kl_per_seq: float, n: int) -> None:
        if self.cfg.kl_adaptive:  # proportional controller, error clipped to +-20%
            error = max(min(kl_per_seq / self.cfg.kl_target - 1, 0.2), -0.2)
            self.beta *= 1 + error * n / self.cfg.kl_horizon

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        batch.token_rewards, metrics = self.token_rewards(batch)
        values = batch.outputs["critic"]
        adv, batch.returns = ops.gae(batch.token_rewards, values, batch.response_mask, self.cfg.gamma, self.cfg.lam)
        if self.cfg.whiten_advantages and int(batch.response_mask.sum()) > 1:
            adv = ops.masked_whiten(adv, batch.response_mask) * batch.response_mask
        return adv, metrics

    def critic_loss(self, values: torch.Tensor, _entropy: Any, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        b, dev = mb.batch, values.device
        loss, stats = ops.value_loss(
            values, b.outputs["critic"].to(dev), b.returns.to(dev), b.response_mask.to(dev), self.cfg.value_clip,
            num_tokens=mb.minibatch_tokens, return_stats=True,
        )
        return loss, {"loss/value": float(loss.detach()) * mb.minibatch_tokens / max(float(b.response_mask.sum()), 1.0),
                      "critic/vf_clipfrac": stats["vf_clipfrac"]}

    def state(self) -> dict:
        return {"beta": self.beta}

    def load_state(self, state: dict) -> None:
        self.beta = state["beta"]


@register_advantage("gae", "GAE(gamma, lambda) on a learned critic's values, whitened over the batch (1506.02438)",
                    needs_role="critic", gamma=1.0, lam=0.95, whiten_advantages=True)  # fmt: skip
def gae_advantage(algo: Algorithm, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    mask = batch.response_mask
    batch.token_rewards = ops.outcome_at_last_token(batch.scores.float(), mask)
    adv, batch.returns = ops.gae(batch.token_rewards, batch.outputs["critic"], mask, param(algo, "gae", "gamma"),
                                 param(algo, "gae", "lam"))  # fmt: skip
    if param(algo, "gae", "whiten_advantages") and int(mask.sum()) > 1:
        adv = ops.masked_whiten(adv, mask) * mask
    return adv, {}
