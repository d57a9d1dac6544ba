"""Two algorithms registered by a plugin, written against the same protocol as the built-ins.

``test_plugin_algo``: REINFORCE with the batch-mean baseline.
``test_plugin_roles``: declares models of its own that the runtime has never heard of -- a
frozen copy of the policy (``anchor``) and a trainable scalar-head model (``value_net``,
regressed on the score) -- and generates one extra temperature-0 response per prompt in
``select``; its advantage is score minus ``value_net``'s prediction at the first token
(regressed on score + 1, so it learns something even when every answer is wrong).

Loaded with ``harness run plugins=[harness_test_plugin.my_algo] algo=test_plugin_algo`` (with
tests/plugin_fixtures on PYTHONPATH), or through the ``harness.algorithms`` entry-point group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import AlgoConfig, Algorithm, Batch, register_algorithm
from algorithms.base import MicroBatch, Needs, Role, Sampler


@dataclass
class TestPluginConfig(AlgoConfig):
    name: str = "test_plugin_algo"
    samples_per_prompt: int = 4  # responses per prompt


@register_algorithm("test_plugin_algo", summary="test plugin: REINFORCE with the batch-mean baseline")
class TestPluginAlgo(Algorithm):
    config_class = TestPluginConfig
    metadata = {
        "baseline": "batch mean",
        "normalisation": "none",
        "kl": "none",
        "aggregation": "token_mean",
        "extra models": "none",
        "extra generation": "none",
    }

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        scores = batch.scores.float()
        return (scores - scores.mean())[:, None] * batch.response_mask, {}


@dataclass
class TestRolesConfig(AlgoConfig):
    name: str = "test_plugin_roles"
    samples_per_prompt: int = 4
    value_lr: float = 1e-3


@register_algorithm("test_plugin_roles", summary="test plugin: its own frozen and trainable models + extra generation")
class TestRolesAlgo(Algorithm):
    config_class = TestRolesConfig

    @property
    def needs(self) -> Needs:
        value_net = Role("value_net", head="scalar", trainable=True, lr=self.cfg.value_lr, loss=self.value_loss)
        return Needs(roles=(Role("anchor"), value_net))

    def select(self, batch: Batch, sampler: Sampler) -> tuple[Batch, dict[str, float]]:
        firsts = sorted({g: i for i, g in reversed(list(enumerate(batch.group_ids.tolist())))}.values())
        extra = sampler.generate([batch.prompts[i] for i in firsts], [batch.ground_truths[i] for i in firsts], 1, 0.0)
        return batch, {"plugin/extra_score": float(extra.scores.mean())}

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        predicted = batch.outputs["value_net"][:, 0]
        mask = batch.response_mask
        anchor_logp = float((batch.outputs["anchor"] * mask).sum() / mask.sum())
        adv = (batch.scores.float() + 1.0 - predicted)[:, None] * mask
        return adv, {"plugin/predicted_mean": float(predicted.mean()), "plugin/anchor_logp_mean": anchor_logp}

    def value_loss(self, values: torch.Tensor, _entropy, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        target = mb.batch.scores.to(values.device).float() + 1.0
        loss = ((values[:, 0] - target) ** 2).sum() / mb.minibatch_seqs
        return loss, {"plugin/value_loss": float(loss.detach())}
