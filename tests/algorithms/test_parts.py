"""Algorithms as compositions of registered parts (algorithms/parts.py): every built-in's own advantage and loss
equal the parts it is made of, a crossed composition computes the other paper's formula, an impossible one is
refused in one line, and a plugin can register a part of its own."""

from __future__ import annotations

import math

import pytest
import torch

import algorithms
from algorithms import MicroBatch, parts
from algorithms.parts import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    LOSSES,
    register_advantage,
    register_aggregation,
)
from tests.helpers import make_batch


def build(name, **overrides):
    cls = algorithms.get_class(name)
    return cls(cls.config_class(**overrides))


def _batch():
    """Two groups of 4 (scores 1 0 0 1 | 1 1 1 0), 3 response tokens, the last of rows 1 and 5 padding."""
    mask = [[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]] * 2
    batch = make_batch([1, 0, 0, 1, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1, 1], T=3, mask=mask)
    batch.old_logp = torch.log(torch.full((8, 3), 0.5))
    batch.ref_logp = batch.old_logp - 0.1  # for the algorithms with a KL term in the loss (grpo)
    batch.outputs["critic"] = torch.linspace(-0.5, 0.5, 24).reshape(8, 3)  # ppo's values (GAE)
    batch.outputs["greedy_score"] = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # remax's greedy baseline
    batch.outputs["prm"] = batch.old_logp + torch.linspace(-0.2, 0.2, 24).reshape(8, 3)  # prime's implicit PRM
    batch.outputs["teacher"] = batch.old_logp - torch.linspace(0.0, 0.3, 24).reshape(8, 3)  # opd's teacher
    return batch


def _loss(algo, batch):
    batch.advantages, _ = algo.advantages(batch)
    gen = torch.Generator().manual_seed(0)
    logp = (batch.old_logp + 0.3 * torch.randn(8, 3, generator=gen)).requires_grad_(True)
    loss, stats = algo.loss(logp, torch.zeros(8, 3), MicroBatch(batch, float(batch.response_mask.sum()), 8.0, 3))
    loss.backward()
    return batch.advantages, loss.detach(), logp.grad, stats


# (algorithm, its own parts named explicitly)
OWN_PARTS = [
    ("grpo", {"advantage": "group", "loss": "ppo_clip"}),
    ("dr_grpo", {"advantage": "group_mean", "loss": "ppo_clip"}),
    ("rloo", {"advantage": "rloo", "loss": "ppo_clip"}),
    ("reinforce_pp", {"kl_coef": 0.0, "advantage": "batch_norm", "loss": "ppo_clip"}),
    ("gspo", {"advantage": "group", "loss": "gspo"}),
    ("cispo", {"advantage": "group", "loss": "cispo"}),
    ("gmpo", {"advantage": "group", "loss": "gmpo"}),
    ("sapo", {"advantage": "group", "loss": "sapo"}),
    ("gpg", {"advantage": "gpg", "loss": "pg"}),
    ("clip_cov", {"advantage": "group", "loss": "clip_cov"}),
    ("kl_cov", {"advantage": "group", "loss": "kl_cov"}),
    ("ppo", {"kl_coef": 0.0, "advantage": "gae", "loss": "ppo_clip"}),
    ("remax", {"kl_coef": 0.0, "advantage": "greedy", "loss": "ppo_clip"}),
    ("prime", {"advantage": "implicit_prm", "loss": "ppo_clip"}),
    ("opd", {"advantage": "teacher_kl", "loss": "ppo_clip"}),
]


@pytest.mark.parametrize("name, own", OWN_PARTS, ids=[n for n, _ in OWN_PARTS])
def test_an_algorithm_named_by_its_own_parts_computes_the_same_bits(name, own):
    kl = {"kl_coef": own["kl_coef"]} if "kl_coef" in own else {}
    plain = _loss(build(name, **kl), _batch())
    composed = _loss(build(name, **own), _batch())
    for a, b in zip(plain[:3], composed[:3]):
        assert torch.equal(a, b)
    assert plain[3] == composed[3]


def test_grpo_with_rloos_advantage_uses_the_leave_one_out_baseline():
    """Group 0 scores 1 0 0 1: each 1 minus the mean of the other three (1/3) = 2/3, each 0: -2/3; group 1
    (1 1 1 0): 1 - 2/3 = 1/3 for the ones, 0 - 1 = -1 for the zero."""
    adv, _ = build("grpo", advantage="rloo").advantages(_batch())
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3, -1.0])
    assert torch.allclose(adv[:, 0], expected) and adv[1, 2] == 0  # padding stays 0


def test_grpo_with_gspos_loss_clips_the_sequence_ratio():
    """One response, A = +1, token ratios 1.2 and 0.8: the sequence ratio sqrt(0.96) = 0.9798 lies below GSPO's clip
    (1 - 3e-4, 1 + 4e-4), where the pessimistic min keeps the unclipped -0.9798 for A > 0 (no clip active); a
    ratio above 1 + 4e-4 would be clipped, so the second case, A = -1 at ratio 0.9798, clips at 0.9997."""
    batch = make_batch([1, 0], [0, 0], T=2, mask=[[1, 1], [1, 1]])
    batch.advantages = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    batch.old_logp = torch.zeros(2, 2)
    logp = torch.tensor([[math.log(1.2), math.log(0.8)], [0.0, 0.0]], requires_grad=True)
    loss, stats = build("grpo", loss="gspo", kl_coef=0.0).loss(logp, torch.zeros(2, 2), MicroBatch(batch, 4.0, 2.0, 2))
    assert loss.item() == pytest.approx(-math.sqrt(0.96) / 2, abs=1e-6) and stats["policy/clipfrac"] == 0.0
    batch.advantages = -batch.advantages
    loss, stats = build("grpo", loss="gspo", kl_coef=0.0).loss(logp, torch.zeros(2, 2), MicroBatch(batch, 4.0, 2.0, 2))
    assert loss.item() == pytest.approx((1 - 3e-4) / 2, abs=1e-6) and stats["policy/clipfrac"] == 0.5  # GRPO's 0.2: no clip


@pytest.mark.parametrize("name, overrides, message", [
    ("grpo", {"advantage": "gae"}, "algo.advantage=gae needs a critic model, which grpo does not declare"),
    ("grpo", {"advantage": "greedy"}, "needs a greedy response per prompt, which grpo does not generate"),
    ("grpo", {"advantage": "rloo", "samples_per_prompt": 1}, "algo.samples_per_prompt=1, set it to 2 or more"),
    ("rloo", {"kl_coef": 0.1, "advantage": "group"}, "rloo folds its KL into the reward"),
    ("grpo", {"loss": "gspoo"}, "algo.loss='gspoo' is unknown (did you mean 'gspo'?)"),
    ("grpo", {"loss_agg": "token_means"}, "algo.loss_agg='token_means' is unknown (did you mean 'token_mean'?)"),
    ("ppo", {"kl_kind": "k4"}, "algo.kl_kind='k4' is unknown; registered: abs, k1, k2, k3, kl, low_var_kl, mse"),
])  # fmt: skip
def test_a_composition_that_cannot_work_is_refused_in_one_line(name, overrides, message):
    with pytest.raises((KeyError, ValueError)) as exc:
        parts.check(build(name, **overrides))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_ppo_and_remax_take_the_parts_that_need_their_models():
    assert parts.check(build("ppo", kl_coef=0.0, advantage="gae")) == []
    assert parts.check(build("remax", advantage="greedy")) == []


def test_a_swapped_in_part_takes_its_papers_parameters_unless_the_run_sets_them():
    """grpo's clip is 0.2; GSPO's loss swapped in clips at GSPO's (3e-4, 4e-4) unless algo.clip_* are set."""
    gspo_on_grpo = build("grpo", loss="gspo")
    assert (parts.param(gspo_on_grpo, "gspo", "clip_low"), parts.param(gspo_on_grpo, "gspo", "clip_high")) == (3e-4, 4e-4)
    assert parts.check(gspo_on_grpo) == []
    set_clip = build("grpo", loss="gspo", clip_low=0.1)
    assert parts.param(set_clip, "gspo", "clip_low") == 0.1 and parts.param(set_clip, "gspo", "clip_high") == 4e-4
    assert parts.check(set_clip) == ["algo.loss=gspo with algo.clip_low=0.1 (set; its paper: clip_low=0.0003)"]
    # the algorithm's own part reads its own config: Dr. GRPO's group advantage stays without the std
    assert parts.param(build("dr_grpo"), "group", "scale_by_std") is False
    # a parameter the algorithm's config lacks comes from the paper: grpo has no tau_pos
    assert parts.param(build("grpo", loss="sapo"), "sapo", "tau_neg") == 1.05


def test_the_composition_is_named_in_the_run_record():
    described = build("grpo", advantage="rloo", loss="gspo").describe()
    assert described["composition"] == "grpo [advantage=rloo, loss=gspo]"
    assert described["normalisation"] == described["baseline"] == "advantage=rloo"  # not grpo's "group std"
    assert "composition" not in build("grpo").describe()


def test_a_plugin_registers_its_own_part(monkeypatch):
    ADVANTAGES.load()
    monkeypatch.setattr(ADVANTAGES, "_entries", dict(ADVANTAGES._entries))  # the registry is global: a copy

    @register_advantage("test_sign", "the score's sign around the group mean", needs_group=True)
    def sign_advantage(algo, batch):
        adv = torch.sign(algorithms.ops.group_normalized_advantage(batch.scores, batch.group_ids, scale_by_std=False))
        return adv[:, None] * batch.response_mask, {}

    adv, _ = build("rloo", advantage="test_sign").advantages(_batch())
    assert adv[:, 0].tolist() == [1, -1, -1, 1, 1, 1, 1, -1]
    assert "test_sign" in ADVANTAGES and "gspo" in LOSSES


# `harness run algo=grpo algo.advantage=rloo algo.loss=gspo` runs as a user types it in tests/test_docs_commands.py
# (docs/adding_an_algorithm.md, the plugins scenario), which checks the progress line names the composition.


def test_aggregations_and_kl_estimators_are_parts_a_plugin_can_add(monkeypatch):
    """The built-in aggregations and estimators by hand; verl's spellings name the same estimator; a plugin's
    aggregation (the loss of each response's worst token, mean over responses) is what algo.loss_agg reads."""
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    by_hand = {"token_mean": 15 / 5, "seq_mean_token_sum": (6 + 9) / 2, "seq_mean_token_mean": (2 + 4.5) / 2,
               "seq_mean_token_sum_norm": (6 / 3 + 9 / 3) / 2}
    for mode, value in by_hand.items():
        assert algorithms.ops.aggregate(loss, mask, mode).item() == pytest.approx(value)
    assert algorithms.ops.aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.25)
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.5]])
    assert algorithms.ops.kl_penalty(logp, ref, "k1").item() == pytest.approx(0.5)
    assert algorithms.ops.kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    assert KL_ESTIMATORS.get("low_var_kl").fn is KL_ESTIMATORS.get("k3").fn and "mse" in KL_ESTIMATORS
    with pytest.raises(ValueError, match="unknown KL estimator 'k33' \\(did you mean 'k3'\\?\\)"):
        algorithms.ops.kl_penalty(logp, ref, "k33")

    AGGREGATIONS.load()
    monkeypatch.setattr(AGGREGATIONS, "_entries", dict(AGGREGATIONS._entries))  # the registry is global: a copy

    @register_aggregation("test_seq_max", "each response's largest token loss, mean over responses")
    def seq_max(loss_mat, m, num_tokens, num_seqs, max_len):
        return torch.where(m != 0, loss_mat, torch.full_like(loss_mat, -1e9)).amax(-1).sum() / (num_seqs or len(m))

    assert algorithms.ops.aggregate(loss, mask, "test_seq_max").item() == pytest.approx((3 + 5) / 2)
    assert parts.check(build("grpo", loss_agg="test_seq_max")) == []


def test_the_covariance_losses_cross_onto_another_algorithm_with_their_papers_parameters():
    """KL-Cov's loss on GRPO (kl 0, KL-Cov's token_mean aggregation): the same advantages, loss and gradient as kl_cov
    itself, whose advantage is GRPO's."""
    assert parts.param(build("grpo", loss="kl_cov"), "kl_cov", "cov_frac") == 2e-3
    assert parts.param(build("dapo", loss="clip_cov"), "clip_cov", "clip_high") == 0.2  # the paper's, not DAPO's 0.28
    own, crossed = _loss(build("kl_cov"), _batch()), _loss(build("grpo", loss="kl_cov", kl_coef=0.0, loss_agg="token_mean"), _batch())
    for a, b in zip(own[:3], crossed[:3]):
        assert torch.equal(a, b)


def test_shaping_and_filters_are_hooks_any_algorithm_takes():
    """DAPO named by its own parts trains the same bits; DAPO's overlong shaping on GRPO shapes the scores GRPO's
    advantage reads (L_max 20, L_cache 4: lengths 20 and 17 get -1 and -0.25), while the batch keeps the checker's."""
    assert parts.label(build("dapo").cfg) == "" and parts.label(build("dapo", shaping="none").cfg) == "dapo [shaping=none]"
    plain, named = _loss(build("dapo"), _batch()), _loss(build("dapo", advantage="group", filter="dynamic"), _batch())
    for a, b in zip(plain[:3], named[:3]):
        assert torch.equal(a, b)
    grpo = build("grpo", shaping="overlong", filter="dynamic")
    assert parts.label(grpo.cfg) == "grpo [shaping=overlong, filter=dynamic]" and parts.check(grpo) == []
    assert grpo.select.func.__name__ == "dynamic_sampling" and parts.param(grpo, "dynamic", "extra_sampling_rounds") == 3
    mask = (torch.arange(20)[None, :] < torch.tensor([20, 17, 5, 5])[:, None]).tolist()
    batch = make_batch([1, 1, 0, 0], [0, 0, 0, 0], T=20, mask=mask)
    batch.truncated = torch.tensor([True, False, False, False])
    adv, metrics = grpo.advantages(batch)
    shaped = torch.tensor([0.0, 0.75, 0.0, 0.0])
    expected = (shaped - shaped.mean()) / (shaped.std() + 1e-6)
    assert torch.allclose(adv[:, 0], expected, atol=1e-6) and batch.scores.tolist() == [1, 1, 0, 0]
    assert metrics["dapo/overlong_penalty_mean"] == pytest.approx(-1.25 / 4)
    with pytest.raises(ValueError, match="algo.filter=accuracy filters groups of samples per prompt"):
        parts.check(build("grpo", filter="accuracy", samples_per_prompt=1))
    with pytest.raises(ValueError, match="algo.shaping='overlongg' is unknown \\(did you mean 'overlong'\\?\\)"):
        parts.check(build("grpo", shaping="overlongg"))
