"""Each config group is defined once: the dataclass Hydra fills is the one its reader takes
(harness/runtime/settings.py, harness/data/tasks.py, harness/data/envs), read-only once built."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from omegaconf import OmegaConf

from harness.config import ConfigError, group, runtime_settings
from harness.data.tasks import TaskConfig
from harness.runtime.settings import DriverSettings, RolloutConfig, TrainerConfig


def test_the_runtime_gets_each_group_as_composed(compose_cfg):
    cfg = compose_cfg(["trainer.lr=2e-4", "rollout.top_k=5", "runtime.fsdp_shard_size=1", "task.max_prompt_tokens=99",
                       "correction.cap=3", "env.max_turns=2", "plugins=[json]"])  # fmt: skip
    s = runtime_settings(cfg)
    assert isinstance(s, DriverSettings) and isinstance(s.trainer, TrainerConfig) and isinstance(s.task, TaskConfig)
    assert (s.trainer.lr, s.rollout.top_k, s.runtime.fsdp_shard_size, s.task.max_prompt_tokens) == (2e-4, 5, 1, 99)
    assert (s.correction.cap, s.env.max_turns, s.plugins) == (3.0, 2, ("json",))
    for name in ("model", "trainer", "rollout", "correction", "runtime", "env", "task"):  # every field, as composed
        assert dataclasses.asdict(getattr(s, name)) == OmegaConf.to_container(cfg[name], resolve=True), name
    worker = s.worker(return_logp=True)
    assert worker.trainer is s.trainer and worker.runtime is s.runtime and worker.return_logp
    assert pickle.loads(pickle.dumps(worker)) == worker  # worker processes and Ray actors get a copy


def test_a_built_group_is_read_only(compose_cfg):
    s = runtime_settings(compose_cfg([]))
    with pytest.raises(AttributeError, match="TrainerConfig.lr is read-only once built"):
        s.trainer.lr = 1.0
    assert dataclasses.replace(s.trainer, lr=1.0).lr == 1.0 and s.trainer.lr != 1.0  # a role's own lr: a copy


def test_an_untyped_config_yaml_is_typed_by_the_schema(compose_cfg, tmp_path):
    """A run directory's config.yaml is plain YAML: `lr: 1` is an int there, a float in the group."""
    cfg = compose_cfg(["trainer.lr=1"])
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    loaded = OmegaConf.load(tmp_path / "config.yaml")
    settings = runtime_settings(loaded)
    assert settings.trainer.lr == 1.0 and isinstance(settings.trainer.lr, float)
    assert settings == runtime_settings(cfg)
    del loaded.rollout.top_k  # a key an older run lacks: the default
    assert group(RolloutConfig, loaded.rollout).top_k == RolloutConfig().top_k


def test_an_unknown_key_in_a_loaded_group_is_named():
    with pytest.raises(ConfigError, match="stepz: not a field of TrainerConfig"):
        group(TrainerConfig, OmegaConf.create({"stepz": 3}))


def test_a_loaded_group_with_a_bad_value_or_nested_key_is_named():
    """A hand-edited config.yaml: a value of the wrong type, or a misspelt key in a nested group, is one ConfigError
    naming the key."""
    with pytest.raises(ConfigError, match="lr: Value 'abc' of type 'str' could not be converted to Float"):
        group(TrainerConfig, OmegaConf.create({"lr": "abc"}))
    with pytest.raises(ConfigError, match="vllm.dtypo: not a field of RolloutConfig; known: dtype,"):
        group(RolloutConfig, OmegaConf.create({"vllm": {"dtypo": "auto"}}))

