"""HFRollout's seeded sampler: a prompt's samples do not depend on the other prompts in the call."""

import pytest
import torch

import rewards
from harness.data.tasks import load_task, render_prompt
from harness.models import load_causal_lm, load_tokenizer, resolve_model
from harness.runtime.rollout.hf import HFRollout, SeededGumbelSampler


@pytest.fixture(scope="module")
def rollout():
    from tests.conftest import compose

    cfg = compose(["model.tiny.sft_steps=0", "task.train_size=300"])
    task = load_task(cfg.task)
    path, _ = resolve_model(cfg.model, task, rewards.get(cfg.task.checker), cfg.rollout.max_response_tokens)
    tok = load_tokenizer(path)
    prompts = [render_prompt(ex.messages, tok, True) for ex in task.train[:4]]
    return HFRollout(load_causal_lm(path, "float32"), tok), prompts


def test_samples_do_not_depend_on_how_prompts_are_split(rollout):
    r, prompts = rollout
    seeds = [11, 22, 33, 44]
    whole = r.generate(prompts, 3, 8, temperature=1.0, seeds=seeds)
    halves = [r.generate(prompts[:1], 3, 8, seeds=seeds[:1]), r.generate(prompts[1:], 3, 8, seeds=seeds[1:])]
    rows = [g.response_ids[i][g.response_mask[i]].tolist() for g in halves for i in range(len(g.response_ids))]
    assert rows == [whole.response_ids[i][whole.response_mask[i]].tolist() for i in range(12)]
    # Different seeds, different samples (the untrained model samples near-uniformly).
    other = r.generate(prompts, 3, 8, temperature=1.0, seeds=[s + 1000 for s in seeds])
    assert not torch.equal(other.response_ids, whole.response_ids)
    # Samples of one prompt differ from each other (each row has its own stream).
    assert len({tuple(x) for x in rows[:3]}) > 1


def test_gumbel_max_samples_the_softmax():
    """Frequencies of argmax(logits + Gumbel) match softmax(logits) (20k rows, 3 sigma)."""
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0]]).repeat(20000, 1)
    sampler = SeededGumbelSampler(list(range(20000)), "cpu")
    picks = sampler(None, logits).argmax(-1)
    freq = torch.bincount(picks, minlength=4).float() / 20000
    p = torch.softmax(logits[0], -1)
    assert torch.all((freq - p).abs() < 3 * (p * (1 - p) / 20000).sqrt() + 1e-3), (freq, p)
