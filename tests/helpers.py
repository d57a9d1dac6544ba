"""Small builders shared by the hand-computed algorithm tests."""

import os
from pathlib import Path

import torch

import algorithms
from algorithms import Batch
from harness.rundir.schema import read_metrics

# The seed of the learning tier's runs (tests/algorithms/test_learning.py, the reward-model test). Their thresholds
# were set from the gains measured on seeds 0, 1 and 2 (docs/reproducibility.md): HARNESS_LEARNING_SEED=1 make
# test-learning measures another seed. CI runs seed 0.
LEARNING_SEED = int(os.environ.get("HARNESS_LEARNING_SEED", "0"))


def make_batch(scores, group_ids, T=2, mask=None):
    """A scored batch of len(scores) responses of T tokens (all valid unless ``mask``)."""
    B = len(scores)
    return Batch(
        prompt_ids=torch.ones(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.ones(B, T, dtype=torch.long),
        response_mask=torch.ones(B, T, dtype=torch.bool)
        if mask is None
        else torch.tensor(mask, dtype=torch.bool),
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
    from harness.data.tasks import load_task
    from harness.models import resolve_model
    from harness.runtime.driver.hybrid_engine import HybridEngine

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


def untrained_tiny_model(path) -> object:
    """A random-init tiny Qwen2 and its arith tokenizer saved at ``path`` (its responses rarely end early, so
    they span several segments of a partial rollout); returns the tokenizer."""
    from harness.models import new_qwen2, train_tokenizer

    texts = [f"What is {a} + {b}? Answer: {a + b}" for a in range(30) for b in range(30)]
    tok = train_tokenizer(texts, 120)
    torch.manual_seed(0)
    new_qwen2(
        tok, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2
    ).save_pretrained(path)
    tok.save_pretrained(path)
    return tok


def segments_against_versions(
    backend, model_dir: str, prompts: list[str], tol: float, noise: float = 0.05
) -> dict:
    """Partial rollouts on a real ``backend``: generate ``prompts`` (2 samples each, 2 tokens per segment,
    at most 12 tokens) while two weight pushes land mid-generation (before segments 2 and 3), then
    recompute every token's log-prob with the weights of each version (the trainer's forward,
    harness/runtime/train/fsdp.py). Asserts that each token's ``rollout_logp`` equals its own version's
    within ``tol`` and that the other versions' are far from it (so a wrong tag would fail). Returns
    the measured gaps."""
    from types import SimpleNamespace

    from harness.models import load_causal_lm
    from harness.runtime.driver.partial import generate_in_segments
    from harness.runtime.rollout.base import request_seeds
    from harness.runtime.train.fsdp import TrainEngine, init_distributed

    init_distributed("cpu")
    model = load_causal_lm(model_dir, "float32")
    torch.manual_seed(0)
    states = []
    for v in range(3):  # version 0: the model's weights; each later one moved by noise (tied weights once)
        if v:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(noise * torch.randn_like(p))
        states.append({k: t.clone() for k, t in model.state_dict().items()})
    backend.load_weights(states[0])
    calls = []

    def checkpoint() -> int:  # called before each segment: pushes before the 2nd and the 3rd
        calls.append(len(calls))
        version = min(len(calls) - 1, 2)
        if len(calls) in (2, 3):
            backend.load_weights(states[version])
        return version

    rng = torch.Generator().manual_seed(1)
    gen, counts = generate_in_segments(
        lambda ctx, k, cap, sd: backend.generate(ctx, k, cap, 1.0, 1.0, seeds=sd), prompts, 2, 12,
        request_seeds(len(prompts), 2, rng), lambda k: request_seeds(k, 1, rng), checkpoint, chunk_tokens=2,
        eos_ids=backend.eos_ids, pad_id=backend.pad_id,
    )  # fmt: skip
    mask, versions = gen.response_mask, gen.token_version
    assert gen.rollout_logp is not None and counts.interrupts == 2
    assert (versions[mask] >= 0).all() and (versions[~mask] == -1).all()
    assert {0, 1, 2} <= set(versions[mask].tolist()), "every version sampled some tokens"
    assert counts.resumed > 0, "some sequence was sampled by more than one version"
    # Tokens appear in version order within a sequence: segments 1 | 2 | 3.. -> versions 0 | 1 | 2
    for row in range(len(versions)):
        v = versions[row][mask[row]]
        assert (v[1:] >= v[:-1]).all() and (v[:2] == 0).all()
    optim = SimpleNamespace(lr=0.0, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0, grad_clip=1.0)
    out = {}
    recomputed = []
    for v in range(3):
        m = load_causal_lm(model_dir, "float32")
        m.load_state_dict(states[v])
        with torch.no_grad():
            recomputed.append(TrainEngine(m, "cpu", "fp32", optim).forward(gen, 1.0)[0].cpu())
    for v in range(3):
        own = mask & (versions == v)
        gap = (gen.rollout_logp - recomputed[v])[own].abs()
        others = [(gen.rollout_logp - recomputed[w])[own].abs().mean() for w in range(3) if w != v]
        out[f"v{v}_tokens"], out[f"v{v}_gap_max"] = int(own.sum()), float(gap.max())
        out[f"v{v}_other_versions_gap_mean_min"] = float(min(others))
        assert float(gap.max()) < tol, f"version {v}: |rollout - recomputed| up to {float(gap.max()):.2e}"
        assert float(min(others)) > 10 * tol, (
            "the versions' log-probs are too close for the test to tell them apart"
        )
    return out


TIMINGS = ("perf/", "budget/wall_s")  # metrics that differ run to run


def metrics_without_timings(run_dir: Path) -> list[dict]:
    """A run's metrics.jsonl rows, timings left out: what two runs of one seed must share."""
    return [
        {k: v for k, v in sorted(r.items()) if not k.startswith(TIMINGS)}
        for r in read_metrics(run_dir / "metrics.jsonl")
    ]
