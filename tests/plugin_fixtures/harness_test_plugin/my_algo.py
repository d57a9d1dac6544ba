"""``test_plugin_algo``: REINFORCE with the batch-mean baseline, registered by a plugin.

Loaded with ``harness run plugins=[harness_test_plugin.my_algo] algo=test_plugin_algo`` (with
tests/plugin_fixtures on PYTHONPATH), or through the ``harness.algorithms`` entry-point group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import AlgoConfig, Algorithm, Batch, register_algorithm


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

    def advantages(self, batch: Batch) -> torch.Tensor:
        scores = batch.scores.float()
        return (scores - scores.mean())[:, None] * batch.response_mask
