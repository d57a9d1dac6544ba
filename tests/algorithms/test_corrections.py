"""The rollout-training mismatch corrections (algorithms/corrections.py), by hand.

Two responses with known token ratios r = pi_old / pi_rollout: row 0 has r = 0.5, 1, 2, 4; row 1
has r = 1, 1, 0.25 and a padding token. Every weight below is worked out from the formulas in the
module docstring."""

import math

import pytest
import torch

from algorithms.corrections import (
    REGISTRY,
    available_corrections,
    correction_stats,
    correction_weights,
    log_ratio,
    register_correction,
    sequence_mismatch_stats,
)
from harness.runtime.train.update import UpdateResult, combine

ROLLOUT = torch.full((2, 4), -2.0)
OLD = ROLLOUT + torch.log(torch.tensor([[0.5, 1.0, 2.0, 4.0], [1.0, 1.0, 0.25, 9.0]]))
MASK = torch.tensor([[True, True, True, True], [True, True, True, False]])


def weights(name: str, low: float, high: float) -> torch.Tensor:
    return correction_weights(name, OLD, ROLLOUT, MASK, low, high)


def close(a: torch.Tensor, b: list) -> bool:
    return torch.allclose(a, torch.tensor(b, dtype=a.dtype), atol=1e-5)


def test_token_corrections():
    assert close(weights("tis", 0.0, 3.0), [[0.5, 1, 2, 3], [1, 1, 0.25, 0]])  # capped at 3; padding 0
    assert close(weights("mask", 0.0, 3.0), [[0.5, 1, 2, 0], [1, 1, 0.25, 0]])  # r = 4 dropped
    assert close(weights("mask", 0.6, 3.0), [[0, 1, 2, 0], [1, 1, 0, 0]])  # and r < 0.6
    assert close(weights("icepop", 0.6, 3.0), [[0, 1, 2, 0], [1, 1, 0, 0]])  # the same band
    with pytest.raises(ValueError, match="lower bound > 0"):
        weights("icepop", 0.0, 3.0)


def test_sequence_is_uses_the_product_of_token_ratios():
    """Sequence IS as published (verl; Liu et al. 2025): R = prod_t r_t = 0.5*1*2*4 = 4 for row 0, 0.25 for row 1."""
    assert close(weights("seq_tis", 0.0, 5.0), [[4] * 4, [0.25] * 3 + [0]])
    assert close(weights("seq_tis", 0.0, 3.0), [[3] * 4, [0.25] * 3 + [0]])  # row 0 capped at C
    assert close(weights("seq_mis", 0.0, 5.0), [[4] * 4, [0.25] * 3 + [0]])
    assert close(weights("seq_mis", 0.0, 3.0), [[0] * 4, [0.25] * 3 + [0]])  # row 0 (R = 4 > 3) dropped whole
    assert close(weights("seq_mis", 0.3, 5.0), [[4] * 4, [0] * 4])  # row 1 (R = 0.25 < 0.3) dropped


def test_token_veto_drops_a_sequence_with_any_token_under_the_floor():
    """Row 0's smallest ratio is 0.5, row 1's 0.25 (its padding's 9 is not a token)."""
    assert close(weights("token_veto", 0.5, 2.0), [[1] * 4, [0] * 4])  # row 0 exactly on the floor: kept
    assert close(weights("token_veto", 0.6, 2.0), [[0] * 4, [0] * 4])
    assert close(weights("token_veto", 0.25, 2.0), [[1] * 4, [1] * 3 + [0]])  # row 1 on the floor
    with pytest.raises(ValueError, match="correction.low > 0"):
        weights("token_veto", 0.0, 2.0)


def test_ratios_exactly_on_a_bound_are_inside():
    """lo = 0.5 and C = 2 and 4 against ratios 0.5, 2 and 4 (R = 4 for row 0): inclusive bounds, compared in log space
    (exp of the float log-ratio of 0.5 may round below 0.5)."""
    assert close(weights("mask", 0.5, 4.0), [[0.5, 1, 2, 4], [1, 1, 0, 0]])
    assert close(weights("icepop", 0.5, 2.0), [[0.5, 1, 2, 0], [1, 1, 0, 0]])
    assert close(weights("tis", 0.0, 4.0), [[0.5, 1, 2, 4], [1, 1, 0.25, 0]])
    assert close(weights("seq_mis", 0.25, 4.0), [[4] * 4, [0.25] * 3 + [0]])  # R = 4 = C and R = 0.25 = lo: both kept
    assert close(weights("seq_tis", 0.0, 4.0), [[4] * 4, [0.25] * 3 + [0]])


def test_a_long_sequences_product_neither_overflows_nor_turns_nan():
    """200 tokens at r = 2: R = 2^200 (1.6e60, inf in float32) is compared in log space."""
    rollout, mask = torch.full((1, 200), -3.0), torch.ones(1, 200, dtype=torch.bool)
    old = rollout + math.log(2.0)
    assert close(correction_weights("seq_tis", old, rollout, mask, 0.0, 2.0), [[2.0] * 200])
    assert close(correction_weights("seq_mis", old, rollout, mask, 0.0, 2.0), [[0.0] * 200])
    assert close(correction_weights("seq_tis", rollout, old, mask, 0.0, 2.0), [[0.0] * 200])  # R = 2^-200


def test_sequence_corrections_on_the_geometric_mean():
    rho0, rho1 = 4 ** 0.25, 0.25 ** (1 / 3)  # geometric means: (0.5*1*2*4)^(1/4) = 1.414, (1*1*0.25)^(1/3) = 0.630
    assert close(weights("seq_geo_tis", 0.0, 3.0), [[rho0] * 4, [rho1] * 3 + [0]])
    assert close(weights("seq_geo_tis", 0.0, 1.2), [[1.2] * 4, [rho1] * 3 + [0]])  # row 0 capped
    assert close(weights("seq_mask", 0.7, 3.0), [[1] * 4, [0] * 4])  # row 1's 0.630 is below 0.7
    assert close(weights("seq_mask", 0.5, 1.2), [[0] * 4, [1] * 3 + [0]])  # row 0's 1.414 is above 1.2


def test_rejection_by_divergence():
    k1 = [abs(math.log(4) / 4), abs(math.log(0.25) / 3)]  # 0.347, 0.462 nats/token
    assert close(weights("reject_k1", 0.0, 0.4), [[1] * 4, [0] * 4])
    assert close(weights("reject_k1", 0.0, 0.5), [[1] * 4, [1] * 3 + [0]]) and max(k1) < 0.5
    k3_row0 = sum(r - 1 - math.log(r) for r in (0.5, 1, 2, 4)) / 4  # 0.528
    k3_row1 = (0.25 - 1 - math.log(0.25)) / 3  # 0.212
    assert k3_row1 < 0.3 < k3_row0
    assert close(weights("reject_k3", 0.0, 0.3), [[0] * 4, [1] * 3 + [0]])


def test_agreeing_policies_weigh_every_token_one():
    """No mismatch (r = 1 everywhere): every correction keeps every token at weight 1."""
    for name in available_corrections():
        low = 0.5 if name in ("icepop", "seq_mask", "seq_mis", "token_veto") else 0.0
        w = correction_weights(name, ROLLOUT, ROLLOUT, MASK, low, 2.0)
        assert torch.equal(w, MASK.float()), name


def test_stats_name_the_dropped_and_the_ratio_quantiles():
    lr = log_ratio(OLD, ROLLOUT, MASK)
    s = correction_stats(weights("mask", 0.6, 3.0), lr, MASK, 3.0, "mask")
    assert s["rollout/correction_dropped_frac"] == pytest.approx(3 / 7)  # 0.5, 4 and 0.25 of 7 tokens
    assert s["rollout/tis_capped_frac"] == pytest.approx(3 / 7)
    assert s["rollout/ratio_p50"] == pytest.approx(1.0)  # of 0.25, 0.5, 1, 1, 1, 2, 4
    assert s["rollout/ratio_p05"] < 0.5 and s["rollout/ratio_p95"] > 2.0
    t = correction_stats(weights("tis", 0.0, 3.0), lr, MASK, 3.0, "tis")
    assert t["rollout/tis_capped_frac"] == pytest.approx(1 / 7) and t["rollout/correction_dropped_frac"] == 0.0


def test_a_plugin_registers_its_own_and_unknown_names_are_refused(monkeypatch):
    REGISTRY.load()
    monkeypatch.setattr(REGISTRY, "_entries", dict(REGISTRY._entries))  # the registry is global: a copy for this test

    @register_correction("test_halve", "every token at weight 0.5")
    def halve(old, rollout, mask, low, high):
        return 0.5 * mask.float()

    assert "test_halve" in available_corrections()
    assert close(weights("test_halve", 0.0, 1.0), [[0.5] * 4, [0.5] * 3 + [0]])
    monkeypatch.undo()
    assert "test_halve" not in available_corrections()
    with pytest.raises(KeyError, match=r"correction.name='nope' is unknown \(did you mean 'none'\?\); registered: icepop"):
        weights("nope", 0.0, 1.0)
    with pytest.raises(ValueError, match="upper bound must be > 0"):
        weights("tis", 0.0, 0.0)


def test_mismatch_metrics_by_hand():
    """The step's mismatch metrics from the two rows, split over two ranks' results (combine merges them).
    Tokens, l = log r: k1 = mean(-l) = 0 (the logs cancel); k3 = mean(r - 1 - l) = (0.193 + 0 + 0.307 + 1.614 + 0 + 0
    + 0.636) / 7; chi2 = mean((r - 1)^2) = (0.25 + 0 + 1 + 9 + 0 + 0 + 0.5625) / 7. Sequences, R = 4 and 0.25:
    seq_k1 = 0, seq_k3 = ((4 - 1 - ln 4) + (0.25 - 1 + ln 4)) / 2, seq_chi2 = (9 + 0.5625) / 2, ESS = 4.25^2 / (2 x
    16.0625), the perplexity ratio = (4^(-1/4) + 0.25^(-1/3)) / 2; seq_mis at C = 3 drops row 0 whole."""
    w = weights("seq_mis", 0.0, 3.0)
    ranks = [UpdateResult(), UpdateResult()]
    for rank, row in zip(ranks, (0, 1)):
        rank.add_mismatch(OLD[row : row + 1], ROLLOUT[row : row + 1], MASK[row : row + 1], w[row : row + 1])
    m = combine(ranks, "policy")
    k3 = [0.5 - 1 - math.log(0.5), 0.0, 2 - 1 - math.log(2), 4 - 1 - math.log(4), 0.0, 0.0, 0.25 - 1 - math.log(0.25)]
    assert m["mismatch/k1"] == pytest.approx(0.0, abs=1e-6)
    assert m["mismatch/k3"] == pytest.approx(sum(k3) / 7, rel=1e-5)
    assert m["mismatch/chi2"] == pytest.approx(10.8125 / 7, rel=1e-5)
    assert m["mismatch/seq_k1"] == pytest.approx(0.0, abs=1e-6)
    assert m["mismatch/seq_k3"] == pytest.approx((3 - math.log(4) - 0.75 + math.log(4)) / 2, rel=1e-5)
    assert m["mismatch/seq_chi2"] == pytest.approx(9.5625 / 2, rel=1e-5)
    assert m["mismatch/ess"] == pytest.approx(4.25**2 / (2 * 16.0625), rel=1e-5)
    assert m["mismatch/ppl_ratio"] == pytest.approx((4 ** -0.25 + 0.25 ** (-1 / 3)) / 2, rel=1e-5)
    assert m["mismatch/seq_ratio_p50"] == pytest.approx(2.125, rel=1e-5)  # halfway between 0.25 and 4
    assert m["mismatch/rejected_seq_frac"] == 0.5


def test_agreeing_policies_show_no_mismatch_and_one_dominant_sequence_a_low_ess():
    same = sequence_mismatch_stats(torch.zeros(8), torch.zeros(8))
    assert same["mismatch/ess"] == pytest.approx(1.0) and same["mismatch/seq_k3"] == 0.0
    assert same["mismatch/ppl_ratio"] == 1.0 and "mismatch/rejected_seq_frac" not in same
    one = sequence_mismatch_stats(torch.tensor([50.0] + [0.0] * 7), torch.zeros(8))  # R = e^50 (capped at e^20)
    assert one["mismatch/ess"] == pytest.approx(1 / 8, rel=1e-6)
    assert all(math.isfinite(v) for v in one.values())
