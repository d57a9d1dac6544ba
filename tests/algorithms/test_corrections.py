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
)

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


def test_sequence_corrections():
    rho0, rho1 = 4 ** 0.25, 0.25 ** (1 / 3)  # geometric means: (0.5*1*2*4)^(1/4) = 1.414, (1*1*0.25)^(1/3) = 0.630
    assert close(weights("seq_tis", 0.0, 3.0), [[rho0] * 4, [rho1] * 3 + [0]])
    assert close(weights("seq_tis", 0.0, 1.2), [[1.2] * 4, [rho1] * 3 + [0]])  # row 0 capped
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
        low = 0.5 if name in ("icepop", "seq_mask") else 0.0
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


def test_a_plugin_registers_its_own_and_unknown_names_are_refused():
    @register_correction("test_halve", "every token at weight 0.5")
    def halve(old, rollout, mask, low, high):
        return 0.5 * mask.float()

    try:
        assert "test_halve" in available_corrections()
        assert close(weights("test_halve", 0.0, 1.0), [[0.5] * 4, [0.5] * 3 + [0]])
    finally:
        REGISTRY.remove("test_halve")  # the registry is global: leave it as the other tests expect
    with pytest.raises(KeyError, match="rollout.correction='nope' is unknown; registered: icepop"):
        weights("nope", 0.0, 1.0)
    with pytest.raises(ValueError, match="upper bound must be > 0"):
        weights("tis", 0.0, 0.0)
