"""DAPO: dynamic sampling with a fake sampler, overlong shaping, clip-higher loss."""

import math

import pytest
import torch

import algorithms
from algorithms import Batch, MicroBatch
from algorithms.dapo import overlong_penalty
from algorithms.ops import uniform_group_rows


def make_batch(scores, group_ids, T=2, lengths=None, truncated=None, tag=""):
    B = len(scores)
    lengths = [T] * B if lengths is None else lengths
    mask = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    return Batch(
        prompt_ids=torch.ones(B, 1, dtype=torch.long),
        prompt_mask=torch.ones(B, 1, dtype=torch.bool),
        response_ids=torch.ones(B, T, dtype=torch.long),
        response_mask=mask,
        group_ids=torch.tensor(group_ids),
        prompts=[""] * B,
        responses=[f"{tag}g{g}" for g in group_ids],  # marks where each row came from
        ground_truths=[""] * B,
        truncated=torch.zeros(B, dtype=torch.bool) if truncated is None else torch.tensor(truncated),
        scores=torch.tensor(scores, dtype=torch.float32),
    )


def groups(tag, *group_scores):
    """A batch of len(group_scores) groups of two samples, ids 0..G-1 (as each rollout numbers them)."""
    scores = [s for pair in group_scores for s in pair]
    ids = [g for g in range(len(group_scores)) for _ in range(2)]
    return make_batch(scores, ids, tag=tag)


def dapo(**overrides):
    cls = algorithms.get_class("dapo")
    return cls(cls.config_class(**overrides))


class FakeSampler:
    def __init__(self, batches):
        self.batches, self.calls = list(batches), 0

    def more(self):
        self.calls += 1
        return self.batches.pop(0)


def picked(batch):
    """{group id: sorted tags of its rows}"""
    out = {}
    for g, r in zip(batch.group_ids.tolist(), batch.responses):
        out.setdefault(g, []).append(r)
    return out


def test_defaults_follow_the_paper():
    cfg = dapo().cfg
    assert (cfg.clip_low, cfg.clip_high, cfg.loss_agg, cfg.kl_coef) == (0.2, 0.28, "token_mean", 0.0)
    assert cfg.overlong_penalty == 1.0 and cfg.overlong_buffer_frac == 0.2
    assert dapo().needs.has("reference") is False


def test_uniform_groups_are_the_uninformative_ones():
    b = groups("", (1, 0), (1, 1), (0, 0), (0, 1))
    assert (~uniform_group_rows(b.scores, b.group_ids)).tolist() == [True, True, False, False, False, False, True, True]


def test_dynamic_sampling_refills_and_truncates_to_the_original_group_count():
    first = groups("a", (1, 0), (1, 1), (0, 0), (0, 1))  # 2 informative of 4
    more = FakeSampler([
        groups("b", (1, 1), (0, 1), (0, 0), (0, 0)),  # +1 -> 3
        groups("c", (1, 0), (1, 0), (1, 1), (0, 1)),  # +3 -> 6 >= 4: stop
        groups("d", (1, 0), (1, 0), (1, 0), (1, 0)),  # never requested
    ])
    out, m = dapo(extra_sampling_rounds=3).select(first, more)
    assert more.calls == 2
    assert len(out) == 8 and sorted(set(out.group_ids.tolist())) == [0, 1, 2, 3]
    # kept in sampling order: a/g0, a/g3, b/g1, c/g0 (c/g1, c/g3 are surplus and discarded)
    assert picked(out) == {0: ["ag0", "ag0"], 1: ["ag3", "ag3"], 2: ["bg1", "bg1"], 3: ["cg0", "cg0"]}
    assert not uniform_group_rows(out.scores, out.group_ids).any()
    assert m["dapo/sampling_rounds"] == 3 and m["dapo/padded_groups"] == 0  # 1 + 2 regenerations
    assert m["dapo/kept_group_frac"] == pytest.approx(6 / 12)  # informative / sampled groups


def test_dynamic_sampling_pads_with_dropped_groups_when_rounds_run_out():
    first = groups("a", (1, 0), (1, 1), (0, 0), (1, 1))  # 1 informative
    more = FakeSampler([groups("b", (0, 0), (0, 0), (1, 1), (1, 1))])  # 0 informative
    out, m = dapo(extra_sampling_rounds=1).select(first, more)
    assert more.calls == 1 and len(out) == 8
    # the informative group, then the earliest dropped ones: a/g1, a/g2, a/g3
    assert picked(out) == {0: ["ag0", "ag0"], 1: ["ag1", "ag1"], 2: ["ag2", "ag2"], 3: ["ag3", "ag3"]}
    assert m["dapo/sampling_rounds"] == 2 and m["dapo/padded_groups"] == 3
    assert m["dapo/kept_group_frac"] == pytest.approx(1 / 8)
    # padded zero-variance groups get zero advantage (no shaping: nothing truncated)
    adv, _ = dapo(extra_sampling_rounds=1).advantages(out)
    assert torch.all(adv[2:] == 0) and adv[0, 0] > 0 > adv[1, 0]


def test_no_resampling_when_every_group_is_informative_or_disabled():
    class Never:
        def more(self):
            raise AssertionError("sampler.more must not be called")

    full = groups("a", (1, 0), (0, 1))
    out, m = dapo().select(full, Never())
    assert picked(out) == {0: ["ag0", "ag0"], 1: ["ag1", "ag1"]}
    assert m["dapo/sampling_rounds"] == 1 and m["dapo/kept_group_frac"] == 1
    off, m = dapo(extra_sampling_rounds=0).select(groups("a", (1, 1), (0, 1)), Never())
    assert len(off) == 4 and m["dapo/kept_group_frac"] == 0.5


def test_resampled_groups_with_other_widths_concatenate():
    first = make_batch([1, 1, 0, 1], [0, 0, 1, 1], T=2)
    wider = make_batch([1, 0, 1, 1], [0, 0, 1, 1], T=4, lengths=[4, 3, 1, 1], tag="b")
    out, _ = dapo().select(first, FakeSampler([wider]))
    assert out.response_ids.shape == (4, 4)
    assert picked(out) == {0: ["g1", "g1"], 1: ["bg0", "bg0"]}
    assert out.response_mask.sum(-1).tolist() == [2, 2, 4, 3]  # the T=2 rows are right-padded


def test_overlong_penalty_by_hand():
    # L_max 20, L_cache 4: free up to 16 tokens, then -1/4 per token down to -1 at 20
    pen = overlong_penalty(torch.tensor([10, 16, 17, 18, 20]), max_len=20, buffer=4, factor=1.0)
    assert torch.allclose(pen, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    assert torch.allclose(overlong_penalty(torch.tensor([19]), 20, 4, 0.5), torch.tensor([-0.375]))


def test_overlong_shaping_enters_the_advantage():
    batch = make_batch([1, 1, 0, 0], [0, 0, 0, 0], T=6, lengths=[3, 5, 6, 6], truncated=[False, False, True, True])
    algo = dapo(max_response_tokens=6, overlong_buffer_tokens=2)
    adv, metrics = algo.advantages(batch)
    # penalties (free up to 4): 0, -0.5, -1, -1 -> shaped 1, 0.5, -1, -1; mean -0.125,
    # deviations 1.125, 0.625, -0.875, -0.875; unbiased var 3.1875 / 3 = 1.0625
    std = math.sqrt(1.0625)
    expected = torch.tensor([1.125, 0.625, -0.875, -0.875]) / (std + 1e-6)
    assert torch.allclose(adv[:, 0], expected, atol=1e-5)
    assert adv[0, 3] == 0  # padding
    assert batch.scores.tolist() == [1, 1, 0, 0]  # the checker score is untouched
    assert metrics["dapo/overlong_penalty_mean"] == pytest.approx(-0.625)


def test_overlong_max_len_resolution():
    algo = dapo()
    truncated = make_batch([1, 0], [0, 0], T=6, lengths=[6, 2], truncated=[True, False])
    assert algo.overlong_max_len(truncated) == 6  # a truncated response is exactly L_max long
    short = make_batch([1, 0], [0, 0], T=5, lengths=[5, 2])
    assert algo.overlong_max_len(short) == 0  # L_max unknown (> 5): not shaped
    assert torch.equal(algo.shaped_scores(short)[0], short.scores)
    short.max_response_tokens = 8  # recorded by the rollout
    assert algo.overlong_max_len(short) == 8
    assert dapo(max_response_tokens=7).overlong_max_len(short) == 7
    # L_cache defaults to 0.2 x L_max: L_max 20 -> 4
    long = make_batch([1, 1], [0, 0], T=20, lengths=[20, 17], truncated=[True, False])
    assert torch.allclose(algo.shaped_scores(long)[0], torch.tensor([0.0, 0.75]))


def test_loss_uses_clip_higher_and_token_mean():
    algo = dapo()
    batch = make_batch([1.0], [0])
    batch.advantages = torch.ones(1, 2)
    batch.old_logp = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    loss, stats = algo.loss(logp, torch.zeros(1, 2), MicroBatch(batch, 2.0, 1.0, 2))
    # ratio 1.5 -> clipped at 1.28 (GRPO: 1.2); ratio 0.5 with A > 0 -> unclipped -0.5
    assert loss.item() == pytest.approx((-1.28 - 0.5) / 2, abs=1e-6)
    assert stats["policy/clipfrac"] == pytest.approx(0.5) and "loss/kl" not in stats
