"""PRIME advantages, PRM loss, and the shared group refill (accuracy filter) by hand."""

import math

import pytest
import torch

import algorithms
from algorithms import Batch, MicroBatch
from algorithms.sampling import refill_groups


def batch_of(scores, groups, T=2):
    B = len(scores)
    return Batch(
        prompt_ids=torch.ones(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.ones(B, T, dtype=torch.long), response_mask=torch.ones(B, T, dtype=torch.bool),
        group_ids=torch.tensor(groups), prompts=[""] * B, responses=[str(s) for s in scores], ground_truths=[""] * B,
        truncated=torch.zeros(B, dtype=torch.bool), scores=torch.tensor(scores, dtype=torch.float32),
        correct=torch.tensor(scores) > 0.5,
    )


def prime(**kw):
    cls = algorithms.get_class("prime")
    return cls(cls.config_class(**kw))


def test_prime_declares_reference_and_a_trainable_prm():
    needs = prime(prm_lr_scale=0.1).needs
    assert [r.name for r in needs.roles] == ["reference", "prm"]
    ref, prm_role = needs.roles
    assert not ref.trainable and prm_role.trainable and prm_role.head == "lm" and prm_role.init == "policy"
    assert (prm_role.lr, prm_role.lr_scale, prm_role.epochs) == (None, 0.1, 1)
    assert prime(prm_lr=1e-5).needs.roles[1].lr == 1e-5


def test_prime_token_rewards_by_hand():
    algo = prime(beta=1.0, dense_coef=1.0, outcome_coef=1.0)
    b = batch_of([1.0, 0.0], [0, 0])
    b.ref_logp = torch.zeros(2, 2)
    b.outputs["prm"] = torch.tensor([[0.1, 0.2], [0.0, -0.1]])  # dense sums: 0.3 and -0.1
    algo.advantages(b)
    # per-token means: 0.15 and -0.05; each sample's baseline is the other's mean, on every token.
    # sample 0: [0.1, 0.2] - (-0.05) -> [0.15, 0.25]; outcome 1 - 0 = 1 at the last token -> [0.15, 1.25]
    # sample 1: [0, -0.1] - 0.15 -> [-0.15, -0.25]; outcome 0 - 1 = -1 -> [-0.15, -1.25]
    assert torch.allclose(b.token_rewards, torch.tensor([[0.15, 1.25], [-0.15, -1.25]]), atol=1e-6)
    assert torch.allclose(b.returns, torch.tensor([[1.4, 1.25], [-1.4, -1.25]]), atol=1e-6)


def test_prime_dense_baseline_has_no_length_bias():
    """Equal per-token implicit rewards give zero dense advantage whatever the lengths."""
    algo = prime(beta=1.0, dense_coef=1.0, outcome_coef=0.0)
    b = batch_of([0.0, 0.0], [0, 0], T=3)
    b.response_mask = torch.tensor([[True, False, False], [True, True, True]])
    b.ref_logp = torch.zeros(2, 3)
    b.outputs["prm"] = torch.full((2, 3), -0.2)
    algo.advantages(b)
    assert torch.allclose(b.returns, torch.zeros(2, 3), atol=1e-6)


def test_prm_loss_is_bce_of_summed_log_ratio():
    algo = prime(beta=0.5)
    b = batch_of([1.0, 0.0], [0, 0])
    b.ref_logp = torch.zeros(2, 2)
    prm_logp = torch.tensor([[1.0, 1.0], [1.0, -1.0]], requires_grad=True)  # logits 1.0 and 0.0
    loss, stats = algo.prm_loss(prm_logp, None, MicroBatch(b, 4.0, 2.0, 2))
    expected = (-math.log(1 / (1 + math.exp(-1.0))) + math.log(2)) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["prm/accuracy"] == 1.0  # logit 1 > 0 predicts correct (label 1); logit 0 predicts wrong (label 0)


def test_refill_keeps_filtered_groups_and_tops_up(caplog):
    # group 0 all correct (filtered out), group 1 mixed (kept)
    first = batch_of([1, 1, 1, 0], [0, 0, 1, 1])
    extra_rounds = [batch_of([0, 1, 0, 0], [0, 0, 1, 1])]  # its group 0 is mixed -> kept
    out, m = refill_groups(first, lambda s: 0 < float(s.mean()) < 1, lambda: extra_rounds.pop(), 3, "t")
    assert "no group passed" not in caplog.text  # it warned on every such step before (2026-12-02)
    assert out.responses == ["1", "0", "0", "1"]
    assert out.group_ids.tolist() == [0, 0, 1, 1]
    assert (m["t/sampling_rounds"], m["t/padded_groups"]) == (2.0, 0.0)
    assert m["t/kept_group_frac"] == pytest.approx(2 / 4)


def test_refill_pads_with_rejected_groups_when_rounds_run_out(caplog):
    first = batch_of([1, 1, 0, 0], [0, 0, 1, 1])
    out, m = refill_groups(first, lambda s: 0 < float(s.mean()) < 1, lambda: batch_of([1, 1, 1, 1], [0, 0, 1, 1]), 2, "t")
    assert len(out) == 4 and m["t/padded_groups"] == 2.0
    assert out.filler.tolist() == [True] * 4  # nothing passed the filter
    assert "t: no group passed the filter in 2 generation round(s)" in caplog.text  # the user is told


@pytest.mark.parametrize("prm_on_filtered", [False, True])
def test_prime_filler_groups_get_no_policy_weight(prm_on_filtered):
    """Groups that failed the accuracy filter and only pad the batch: zero advantage; PRM loss
    only with prm_on_filtered (the default: the PRM learns that they are wrong)."""
    algo = prime(beta=1.0, prm_on_filtered=prm_on_filtered)
    b = batch_of([1.0, 0.0, 0.0, 0.0], [0, 0, 1, 1])
    b.ref_logp = torch.zeros(4, 2)
    b.outputs["prm"] = torch.tensor([[0.1, 0.2], [0.0, -0.1], [0.3, 0.3], [-0.5, 0.1]])
    b.filler = torch.tensor([False, False, True, True])
    adv, _ = algo.advantages(b)
    assert torch.all(adv[2:] == 0) and torch.all(adv[:2] != 0)
    prm_logp = b.outputs["prm"].clone().requires_grad_(True)
    loss, _ = algo.prm_loss(prm_logp, None, MicroBatch(b, 8.0, 4.0, 2))
    loss.backward()
    assert torch.any(prm_logp.grad[:2] != 0)
    assert torch.all(prm_logp.grad[2:] == 0) != prm_on_filtered
