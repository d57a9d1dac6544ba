"""Small builders shared by the hand-computed algorithm tests."""

import torch

import algorithms
from algorithms import Batch


def make_batch(scores, group_ids, T=2, mask=None):
    """A scored batch of len(scores) responses of T tokens (all valid unless ``mask``)."""
    B = len(scores)
    return Batch(
        prompt_ids=torch.ones(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.ones(B, T, dtype=torch.long),
        response_mask=torch.ones(B, T, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool),
        group_ids=torch.tensor(group_ids),
        prompts=[""] * B,
        responses=[""] * B,
        ground_truths=[""] * B,
        truncated=torch.zeros(B, dtype=torch.bool),
        scores=torch.tensor(scores, dtype=torch.float32),
    )


def build(name, **overrides):
    """The registered algorithm ``name`` with its config's defaults overridden."""
    cls = algorithms.get_class(name)
    return cls(cls.config_class(**overrides))


def build_engine(cfg):
    """The HybridEngine a run with config ``cfg`` builds (seeded), with its algorithm, task, checker
    and model path: for tests that drive the engine step by step."""
    import rewards
    from harness.config import runtime_settings, validate
    from harness.models import resolve_model
    from harness.runtime.driver.hybrid_engine import HybridEngine
    from harness.tasks import load_task

    sizes = validate(cfg)
    algo = algorithms.build(cfg.algo)
    task = load_task(cfg.task)
    checker = rewards.get(cfg.task.checker)
    path, _ = resolve_model(cfg.model, task, checker, cfg.rollout.max_response_tokens)
    torch.manual_seed(0)
    return HybridEngine(runtime_settings(cfg), algo.needs, path, sizes), algo, task, checker, path


class EnvReporter:
    """A stub worker for ProcessGroup tests: reports the environment its process started with."""

    def __init__(self, *args):
        pass

    def report(self) -> dict:
        import os

        return {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK")}

    def close(self) -> None:
        pass
