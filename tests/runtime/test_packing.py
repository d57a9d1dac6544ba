"""Sequence packing (trainer.pack_sequences) and token-budgeted micro-batches (trainer.micro_batch_tokens)."""

from __future__ import annotations

import pytest
import torch

from harness.runtime.train.fsdp import packed_inputs
from tests.helpers import build_engine

COMMON = ["model.tiny.sft_steps=20", "task.train_size=400", "task.eval_prompts=8", "trainer.prompts_per_step=4",
          "algo.samples_per_prompt=4", "rollout.max_response_tokens=12"]  # fmt: skip


def _assert_grads_close(g_packed: dict, g_padded: dict) -> None:
    """Gradients equal up to float rounding, measured against each tensor's own scale as well as element-wise.
    An entry is a sum of terms as large as the tensor's largest entries (up to 458 in the critic test), so
    packing's other summation order moves a small entry by an ulp of the large ones. The element-wise bound
    alone (rtol 1e-4, atol 1e-5) took 0.92 of itself on the Xeon and failed on another CPU kind's kernels
    (zen4, KERNEL_PATHS in tests/algorithms/test_pinned_metrics.py: 1.15x at an embed_tokens entry of -0.07, off
    by 2e-5, whose tensor's largest is 413). With 1e-6 of the tensor's largest |entry| added to atol, the worst is
    0.15 of the bound on the Xeon, 0.19 on zen4 and 0.08 on avx2, at 1 and 2 threads (2026-12-06). A packing
    bug (a wrong position, attention across sequences) moves gradients by far more than 1e-6 of their scale."""
    assert g_packed.keys() == g_padded.keys() and g_packed
    for name, expected in g_padded.items():
        scale = expected.abs().max().item()
        torch.testing.assert_close(g_packed[name], expected, rtol=1e-4, atol=1e-5 + 1e-6 * scale, msg=name)


def _grads(engine, batch, pack: bool):
    """Log-probs (or values) of ``batch`` and the gradient of a masked sum of them, packed or padded."""
    engine.pack = pack
    engine.model.zero_grad(set_to_none=True)
    out, _ = engine.forward(batch, temperature=1.0)
    (out * batch.response_mask).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in engine.model.named_parameters() if p.grad is not None}
    engine.model.zero_grad(set_to_none=True)
    return out.detach(), grads


@pytest.mark.parametrize("extra", [[], ["env.name=test_digits", "env.max_turns=3", "env.max_turn_tokens=4"]],
                         ids=["single_turn", "episodes"])
def test_packed_forward_equals_padded(compose_cfg, extra):
    """Log-probs and gradients of the packed forward equal the padded forward's (float rounding),
    for single-turn responses of varied length and for episodes with environment tokens."""
    import tests.episode_envs  # noqa: F401  (registers test_digits)

    engine, _, task, _, _ = build_engine(compose_cfg(["algo=grpo", *COMMON, "rollout.max_response_tokens=20", *extra]))
    try:
        torch.manual_seed(5)
        batch = engine.rollout(task.train[:4], n=4)
        lengths = batch.response_mask.sum(-1)
        assert lengths.min() < lengths.max(), "want responses of different lengths"
        policy = engine.policy
        padded, g_padded = _grads(policy, batch, pack=False)
        packed, g_packed = _grads(policy, batch, pack=True)
        m = batch.response_mask
        torch.testing.assert_close(packed[m], padded[m], rtol=0, atol=2e-5)
        _assert_grads_close(g_packed, g_padded)
    finally:
        engine.close()


def test_packed_critic_equals_padded(compose_cfg):
    engine, _, task, _, _ = build_engine(compose_cfg(["algo=ppo", *COMMON]))
    try:
        torch.manual_seed(6)
        batch = engine.rollout(task.train[:4], n=4)
        critic = engine.models["critic"]
        critic.model.value_head.weight.data.normal_()  # zero-initialised: make the head say something
        padded, g_padded = _grads(critic, batch, pack=False)
        packed, g_packed = _grads(critic, batch, pack=True)
        m = batch.response_mask
        torch.testing.assert_close(packed[m], padded[m], rtol=0, atol=2e-5)
        _assert_grads_close(g_packed, g_padded)
    finally:
        engine.close()


def test_packed_inputs_restart_positions_per_sequence():
    from tests.helpers import make_batch

    batch = make_batch([0.0, 1.0], [0, 0], T=3, mask=[[1, 1, 0], [1, 0, 0]])
    batch.prompt_ids = torch.tensor([[0, 7, 8], [6, 7, 8]])
    batch.prompt_mask = torch.tensor([[False, True, True], [True, True, True]])
    batch.response_ids = torch.tensor([[4, 5, 0], [9, 0, 0]])
    ids, pos, predictors, lengths = packed_inputs(batch)
    assert ids.tolist() == [[7, 8, 4, 5, 6, 7, 8, 9]]
    assert pos.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert predictors.tolist() == [1, 2, 6] and lengths.tolist() == [2, 1]


def test_micro_batches_by_tokens():
    """trainer.micro_batch_tokens: consecutive rows up to the token budget (a longer row alone), never
    more than micro_batch_sequences rows; each rank's share is padded with dummy passes to the most any rank has."""
    from harness.runtime.train.update import micro_batches, rank_micro_batches

    tokens = torch.tensor([4, 4, 4, 12, 1, 1, 1, 1])
    split = micro_batches(torch.arange(8), tokens, 3, 10)
    assert [s.tolist() for s in split] == [[0, 1], [2], [3], [4, 5, 6], [7]]
    assert [s.tolist() for s in micro_batches(torch.arange(8), tokens, 3, 0)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    # two ranks: rows 0-3 (4, 4, 4, 12 tokens: 3 micro-batches) and 4-7 (2 micro-batches, then 1 dummy pass)
    first, second = (rank_micro_batches(torch.arange(8), tokens, r, 2, 3, 10) for r in (0, 1))
    assert [m.tolist() for m in first] == [[0, 1], [2], [3]]
    assert [m if m is None else m.tolist() for m in second] == [[4, 5, 6], [7], None]


def test_a_packed_token_budgeted_run_matches_the_padded_run(tmp_path, compose_cfg):
    """Two RL steps with packing and 40-token micro-batches log the padded run's losses and rewards
    (float rounding apart: same rollouts, the same gradient summed over other micro-batches)."""
    import json

    from harness.trainer import train

    runs = {}
    for name, extra in (("padded", []), ("packed", ["trainer.pack_sequences=true", "trainer.micro_batch_tokens=40"])):
        cfg = compose_cfg(["algo=grpo", *COMMON, "trainer.steps=2", "trainer.eval_every=2", f"run_dir={tmp_path / name}",
                           *extra])  # fmt: skip
        train(cfg, str(tmp_path / name))
        runs[name] = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(runs["padded"], runs["packed"]):
        for key in ("reward/mean", "loss/policy", "eval/arith/accuracy"):
            if key in a:
                assert b[key] == pytest.approx(a[key], abs=1e-4), key
