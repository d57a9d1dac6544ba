"""Shared fixtures: offline mode, a per-session model cache, config composition."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")

# Small, fast settings for end-to-end runs in tests (the real defaults train longer).
FAST_RUN = [
    "model.tiny.sft_steps=20",
    "trainer.steps=3",
    "trainer.prompts_per_step=4",
    "algo.samples_per_prompt=4",
    "trainer.micro_batch_sequences=8",
    "trainer.eval_every=2",
    "task.eval_prompts=8",
    "task.train_size=400",
    "rollout.max_response_tokens=6",
]


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    """Tiny models built by tests go to a throwaway cache, shared by the session."""
    if "HARNESS_CACHE" not in os.environ:
        os.environ["HARNESS_CACHE"] = str(tmp_path_factory.mktemp("harness_cache"))
    yield


def compose(overrides: list[str] | None = None):
    """The composed Hydra config, as `harness run OVERRIDES` would see it."""
    from harness.config import compose_config

    return compose_config(overrides)


@pytest.fixture
def shared_data():
    if not os.path.isdir(SHARED_DATA):
        pytest.skip("../shared/data is not present")
    return os.path.abspath(SHARED_DATA)


@pytest.fixture
def compose_cfg():
    return compose


@pytest.fixture
def fast_run():
    return list(FAST_RUN)
