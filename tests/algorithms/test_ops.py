"""Tests for algorithms/ops.py: hand-worked cases, brute-force references, properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms import ops

FAST = settings(max_examples=25, deadline=None)
DTYPES = [torch.float32, torch.float64]


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


def close(a, b, tol=1e-6):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=tol, rtol=tol), (a, b)


def ragged_mask(gen: torch.Generator, B: int, T: int, interior: bool = True) -> torch.Tensor:
    """Right-padded rows of random length (some empty), optionally with interior holes."""
    lengths = torch.randint(0, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    if interior:
        mask = mask & (torch.rand(B, T, generator=gen) > 0.2)
    return mask


# --------------------------------------------------------------------------- brute-force references


def gae_loops(r, v, mask, gamma, lam):
    B, T = len(r), len(r[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        valid = [i for i in range(T) if mask[b][i]]
        next_v, running = 0.0, 0.0
        for i in reversed(valid):
            delta = float(r[b][i]) + gamma * next_v - float(v[b][i])
            running = delta + gamma * lam * running
            next_v = float(v[b][i])
            adv[b][i] = running
            ret[b][i] = running + float(v[b][i])
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


def returns_loops(r, mask, gamma):
    B, T = len(r), len(r[0])
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        g = 0.0
        for i in reversed(range(T)):
            if mask[b][i]:
                g = float(r[b][i]) + gamma * g
                out[b][i] = g
    return torch.tensor(out, dtype=torch.float64)


# --------------------------------------------------------------------------- gae


@pytest.mark.parametrize("dtype", DTYPES)
def test_gae_hand_computed(dtype):
    # gamma=0.9, lam=0.8 (gamma*lam = 0.72), r=[0,0,1], V=[0.5,0.4,0.3], all valid:
    # t=2: delta = 1 + 0.9*0 - 0.3 = 0.7                  A2 = 0.7
    # t=1: delta = 0 + 0.9*0.3 - 0.4 = -0.13              A1 = -0.13 + 0.72*0.7   = 0.374
    # t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14              A0 = -0.14 + 0.72*0.374 = 0.12928
    # returns = A + V = [0.62928, 0.774, 1.0]
    r = t([[0.0, 0.0, 1.0]], dtype)
    v = t([[0.5, 0.4, 0.3]], dtype)
    adv, ret = ops.gae(r, v, torch.ones(1, 3, dtype=torch.bool), 0.9, 0.8)
    assert adv.dtype == dtype and ret.dtype == dtype
    close(adv, [[0.12928, 0.374, 0.7]])
    close(ret, [[0.62928, 0.774, 1.0]])


def test_gae_masked_positions_skipped():
    # Interior hole, mask [1,0,1]; r=[0,5,1], V=[0.5,9,0.3] (5 and 9 must be ignored):
    # t=2: A2 = 1 - 0.3 = 0.7; t=1 skipped (A, next V carried);
    # t=0: delta = 0 + 0.9*0.3 - 0.5 = -0.23, A0 = -0.23 + 0.72*0.7 = 0.274; R0 = 0.774
    # Right padding, mask [1,1,0]; r=[0,1,7], V=[0.5,0.4,9]:
    # t=1: A1 = 1 + 0 - 0.4 = 0.6 (terminal after last valid token)
    # t=0: delta = 0.9*0.4 - 0.5 = -0.14, A0 = -0.14 + 0.72*0.6 = 0.292; R = [0.792, 1.0]
    r = t([[0.0, 5.0, 1.0], [0.0, 1.0, 7.0]])
    v = t([[0.5, 9.0, 0.3], [0.5, 0.4, 9.0]])
    mask = t([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = ops.gae(r, v, mask, 0.9, 0.8)
    close(adv, [[0.274, 0.0, 0.7], [0.292, 0.6, 0.0]])
    close(ret, [[0.774, 0.0, 1.0], [0.792, 1.0, 0.0]])


def test_gae_gamma_lam_one_is_return_minus_value():
    # gamma = lam = 1: A_t = sum_{s>=t} r_s - V_t
    r = t([[1.0, 2.0, 3.0]])
    v = t([[0.5, 0.25, 1.0]])
    adv, ret = ops.gae(r, v, torch.ones(1, 3), 1.0, 1.0)
    close(adv, [[5.5, 4.75, 2.0]])
    close(ret, [[6.0, 5.0, 3.0]])


@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_loops_on_ragged(seed):
    gen = torch.Generator().manual_seed(seed)
    B, T = 5, 7
    r = torch.randn(B, T, generator=gen, dtype=torch.float64)
    v = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = ragged_mask(gen, B, T)
    gamma, lam = [(0.9, 0.8), (1.0, 1.0), (0.99, 0.95), (0.5, 0.0)][seed]
    adv, ret = ops.gae(r, v, mask, gamma, lam)
    ref_adv, ref_ret = gae_loops(r.tolist(), v.tolist(), mask.tolist(), gamma, lam)
    close(adv, ref_adv, 1e-10)
    close(ret, ref_ret, 1e-10)


def test_gae_does_not_modify_inputs_and_no_grad():
    r = torch.randn(2, 4)
    v = torch.randn(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]])
    r0, v0, m0 = r.clone(), v.detach().clone(), mask.clone()
    adv, ret = ops.gae(r, v, mask, 0.9, 0.9)
    assert torch.equal(r, r0) and torch.equal(v.detach(), v0) and torch.equal(mask, m0)
    assert not adv.requires_grad and not ret.requires_grad


# --------------------------------------------------------------------------- discounted returns


def test_discounted_returns_hand_computed():
    # gamma = 0.5, r = [1,2,4]: G2 = 4, G1 = 2 + 0.5*4 = 4, G0 = 1 + 0.5*4 = 3
    # mask [1,0,1], r = [1,99,4]: G2 = 4, G1 skipped (0), G0 = 1 + 0.5*4 = 3
    r = t([[1.0, 2.0, 4.0], [1.0, 99.0, 4.0]])
    mask = torch.tensor([[True, True, True], [True, False, True]])
    close(ops.discounted_returns(r, mask, 0.5), [[3.0, 4.0, 4.0], [3.0, 0.0, 4.0]])


@pytest.mark.parametrize("seed", range(3))
def test_discounted_returns_matches_loops(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    r = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    mask = ragged_mask(gen, 6, 9)
    gamma = [1.0, 0.9, 0.0][seed]
    close(ops.discounted_returns(r, mask, gamma), returns_loops(r.tolist(), mask.tolist(), gamma), 1e-10)


# --------------------------------------------------------------------------- masked stats


def test_masked_mean_var_whiten():
    # valid x = [1,2,3] (100 is padding): mean 2, unbiased var = (1+0+1)/2 = 1, biased 2/3
    x = t([[1.0, 2.0], [3.0, 100.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    close(ops.masked_mean(x, mask), 2.0)
    close(ops.masked_mean(x, mask, dim=1), [1.5, 3.0])
    close(ops.masked_var(x, mask), 1.0)
    close(ops.masked_var(x, mask, unbiased=False), 2.0 / 3.0)
    w = ops.masked_whiten(x, mask.bool())
    # (x - 2) / sqrt(1 + 1e-8); the masked 100 -> 98 is returned too (caller masks)
    close(w, [[-1.0, 0.0], [1.0, 98.0]], 1e-6)
    close(ops.masked_whiten(x, mask, shift_mean=False), [[1.0, 2.0], [3.0, 100.0]], 1e-6)
    # empty rows do not yield NaN
    close(ops.masked_mean(x, t([[0.0, 0.0], [1.0, 0.0]]), dim=1), [0.0, 3.0])


def test_masked_var_degenerate_raises():
    x = t([1.0, 2.0])
    with pytest.raises(ValueError):
        ops.masked_var(x, t([1.0, 0.0]))
    with pytest.raises(ValueError):
        ops.masked_var(x, t([0.0, 0.0]), unbiased=False)


def test_masked_whiten_matches_torch_on_valid():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = ragged_mask(gen, 4, 6, interior=False)
    mask[0] = True
    valid = x[mask]
    expected = (valid - valid.mean()) / torch.sqrt(valid.var() + 1e-8)
    close(ops.masked_whiten(x, mask)[mask], expected, 1e-10)


# --------------------------------------------------------------------------- group advantages


def test_group_normalized_hand_computed():
    # ids [5,2,5,2,2] -> group 5: scores [1,0]; group 2: scores [1,1,0]
    # group 5: mean 0.5, unbiased std = sqrt((0.25+0.25)/1) = 0.7071068 -> +-0.5/0.7071068 = +-0.7071068
    # group 2: mean 2/3, ss = 1/9+1/9+4/9 = 2/3, var = (2/3)/2 = 1/3, std = 0.5773503
    #          -> [ (1/3)/0.57735, (1/3)/0.57735, (-2/3)/0.57735 ] = [0.5773503, 0.5773503, -1.1547005]
    scores = t([1.0, 1.0, 0.0, 1.0, 0.0])
    ids = torch.tensor([5, 2, 5, 2, 2])
    adv = ops.group_normalized_advantage(scores, ids, eps=0.0)
    close(adv, [0.7071068, 0.5773503, -0.7071068, 0.5773503, -1.1547005])
    # default eps=1e-6 in the denominator
    close(
        ops.group_normalized_advantage(scores, ids),
        [
            0.5 / (0.5**0.5 + 1e-6),
            1 / 3 / (3**-0.5 + 1e-6),
            -0.5 / (0.5**0.5 + 1e-6),
            1 / 3 / (3**-0.5 + 1e-6),
            -2 / 3 / (3**-0.5 + 1e-6),
        ],
    )
    # Dr. GRPO: no std division -> [0.5, 1/3, -0.5, 1/3, -2/3]
    close(ops.group_normalized_advantage(scores, ids, scale_by_std=False), [0.5, 1 / 3, -0.5, 1 / 3, -2 / 3])


def test_group_normalized_singleton_and_constant_groups():
    # id 9 is alone: mean 0, std 1 -> score / (1 + eps); group 4 is constant -> 0
    scores = t([3.0, 2.0, 2.0])
    ids = torch.tensor([9, 4, 4])
    close(ops.group_normalized_advantage(scores, ids), [3.0 / (1 + 1e-6), 0.0, 0.0])
    close(ops.group_normalized_advantage(scores, ids, scale_by_std=False), [3.0, 0.0, 0.0])


def test_group_normalized_matches_torch_std_and_string_ids():
    scores = t([0.3, 1.5, -2.0, 0.7, 4.0, 1.0])
    ids = ["b", "a", "b", "a", "a", "b"]
    adv = ops.group_normalized_advantage(scores, ids)
    for g in ("a", "b"):
        idx = [i for i, x in enumerate(ids) if x == g]
        s = scores[idx]
        close(adv[idx], (s - s.mean()) / (s.std() + 1e-6), 1e-10)


def test_leave_one_out_hand_computed():
    # one group of 4, scores [1,0,0,1], mean 0.5:
    # A_0 = 1 - (0+0+1)/3 = 2/3, A_1 = 0 - (1+0+1)/3 = -2/3, ... = 4/3 * (s - 0.5)
    close(
        ops.leave_one_out_advantage(t([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0])),
        [2 / 3, -2 / 3, -2 / 3, 2 / 3],
    )
    # two interleaved groups of 2 plus a singleton (id 42 -> raw score 5):
    # group 1: [1, 3] -> [1-3, 3-1] = [-2, 2]; group 7: [0, 0] -> [0, 0]
    adv = ops.leave_one_out_advantage(t([1.0, 0.0, 3.0, 5.0, 0.0]), torch.tensor([1, 7, 1, 42, 7]))
    close(adv, [-2.0, 0.0, 2.0, 5.0, 0.0])


def test_group_ops_int_scores_and_float32():
    adv = ops.leave_one_out_advantage(torch.tensor([1, 0]), torch.tensor([0, 0]))
    assert adv.dtype == torch.get_default_dtype()
    close(adv, [1.0, -1.0])
    a32 = ops.group_normalized_advantage(torch.tensor([1.0, 0.0], dtype=torch.float32), torch.tensor([3, 3]))
    assert a32.dtype == torch.float32


group_data = st.integers(1, 12).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=n, max_size=n),
        st.lists(st.integers(0, 3), min_size=n, max_size=n),
    )
)


@FAST
@given(group_data)
def test_property_group_norm_zero_mean_per_group(data):
    scores, ids = t(data[0]), torch.tensor(data[1])
    adv = ops.group_normalized_advantage(scores, ids)
    centred = ops.group_normalized_advantage(scores, ids, scale_by_std=False)
    for g in ids.unique():
        sel = ids == g
        if sel.sum() > 1:
            assert abs(float(adv[sel].mean())) < 1e-6
            assert abs(float(centred[sel].sum())) < 1e-9
        else:
            close(centred[sel], scores[sel])


@FAST
@given(group_data)
def test_property_loo_sums_to_zero_and_matches_definition(data):
    scores, ids = t(data[0]), torch.tensor(data[1])
    adv = ops.leave_one_out_advantage(scores, ids)
    for i in range(len(scores)):
        others = [float(scores[j]) for j in range(len(scores)) if j != i and ids[j] == ids[i]]
        expect = float(scores[i]) - sum(others) / len(others) if others else float(scores[i])
        assert abs(float(adv[i]) - expect) < 1e-9
    for g in ids.unique():
        sel = ids == g
        if sel.sum() > 1:
            assert abs(float(adv[sel].sum())) < 1e-9


@FAST
@given(group_data, st.randoms(use_true_random=False))
def test_property_group_ops_permutation_equivariant(data, rnd):
    scores, ids = t(data[0]), torch.tensor(data[1])
    perm = list(range(len(scores)))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    for fn in (ops.group_normalized_advantage, ops.leave_one_out_advantage):
        close(fn(scores, ids)[perm], fn(scores[perm], ids[perm] * 7 + 100), 1e-9)


# --------------------------------------------------------------------------- clipped surrogate


def surrogate_case(dtype=torch.float64):
    # clip_low = 0.2 (ratio floor 0.8), clip_high = 0.28 (ratio ceiling 1.28, DAPO clip-higher)
    ratios = [1.5, 0.5, 1.5, 0.5, 5.0, 1.0, 3.0]
    advs = [1.0, 1.0, -1.0, -1.0, -1.0, 2.0, 9.0]
    logp = torch.log(t(ratios, dtype)).reshape(1, -1).requires_grad_(True)
    old = torch.zeros(1, 7, dtype=dtype)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])  # last token is padding
    return logp, old, t([advs], dtype), mask


@pytest.mark.parametrize("dtype", DTYPES)
def test_clipped_surrogate_hand_computed(dtype):
    logp, old, adv, mask = surrogate_case(dtype)
    # tok0 A=+1 r=1.5: max(-1.5, -1.28) = -1.28  (clipped branch active, no gradient)
    # tok1 A=+1 r=0.5: max(-0.5, -0.8)  = -0.5   (unclipped; no lower clip for A>0)
    # tok2 A=-1 r=1.5: max( 1.5,  1.28) =  1.5   (unclipped; no upper clip for A<0)
    # tok3 A=-1 r=0.5: max( 0.5,  0.8)  =  0.8   (clipped branch active)
    # tok4 A=-1 r=5  : max( 5,    1.28) =  5     (no dual clip)
    # tok5 A=+2 r=1  : -2
    # tok6 masked -> 0
    loss, stats = ops.clipped_surrogate(logp, old, adv, mask, 0.2, 0.28, return_stats=True)
    assert loss.dtype == dtype
    close(loss, [[-1.28, -0.5, 1.5, 0.8, 5.0, -2.0, 0.0]], 1e-5)
    assert stats["clipfrac"] == pytest.approx(2 / 6)
    assert stats["dual_clipfrac"] == 0.0
    assert stats["ratio_max"] == pytest.approx(5.0)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.5 + 0.5 + 5 + 1) / 6)
    # approx_kl = mean(old - logp) = -mean(log r) over the 6 valid tokens
    expected_kl = -sum(math.log(x) for x in [1.5, 0.5, 1.5, 0.5, 5.0, 1.0]) / 6
    assert stats["approx_kl"] == pytest.approx(expected_kl, rel=1e-5)
    assert all(isinstance(v, float) for v in stats.values())
    # d loss / d logp = -A * r on unclipped tokens, 0 on clipped and masked ones
    loss.sum().backward()
    close(logp.grad, [[0.0, -0.5, 1.5, 0.0, 5.0, -2.0, 0.0]], 1e-5)


def test_clipped_surrogate_dual_clip():
    logp, old, adv, mask = surrogate_case()
    # dual_clip = 3: only A<0 tokens are capped at -A*3 = 3; tok4 (5 -> 3) is the only active one
    loss, stats = ops.clipped_surrogate(logp, old, adv, mask, 0.2, 0.28, dual_clip=3.0, return_stats=True)
    close(loss, [[-1.28, -0.5, 1.5, 0.8, 3.0, -2.0, 0.0]], 1e-6)
    assert stats["dual_clipfrac"] == pytest.approx(1 / 6)
    assert stats["clipfrac"] == pytest.approx(2 / 6)
    loss.sum().backward()
    assert float(logp.grad[0, 4]) == 0.0
    with pytest.raises(ValueError):
        ops.clipped_surrogate(logp, old, adv, mask, 0.2, 0.2, dual_clip=1.0)


def test_clipped_surrogate_sequence_advantages_broadcast():
    logp, old, adv, mask = surrogate_case()
    adv_seq = t([-1.0])
    full = ops.clipped_surrogate(logp, old, adv_seq.expand(1, 7), mask, 0.2, 0.28)
    close(ops.clipped_surrogate(logp, old, adv_seq, mask, 0.2, 0.28), full.detach())
    # without return_stats only the tensor comes back; inputs untouched
    assert torch.is_tensor(full)
    close(old, torch.zeros(1, 7))


def test_clipped_surrogate_ignores_garbage_at_padding():
    logp = torch.tensor([[0.1, float("-inf")]], requires_grad=True)
    old = torch.tensor([[0.0, float("nan")]])
    adv = torch.tensor([[1.0, float("nan")]])
    loss, stats = ops.clipped_surrogate(
        logp, old, adv, torch.tensor([[True, False]]), 0.2, 0.2, dual_clip=3.0, return_stats=True
    )
    assert torch.isfinite(loss).all() and float(loss[0, 1].detach()) == 0.0
    assert all(math.isfinite(v) for v in stats.values())
    loss.sum().backward()
    assert float(logp.grad[0, 1]) == 0.0


# --------------------------------------------------------------------------- aggregate


def agg_case(dtype=torch.float64):
    L = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    return L, mask


@pytest.mark.parametrize("dtype", DTYPES)
def test_aggregate_modes_hand_computed(dtype):
    L, mask = agg_case(dtype)
    # valid: row0 = [1,2], row1 = [4]
    close(ops.aggregate(L, mask, "token_mean"), 7 / 3)  # (1+2+4)/3
    close(ops.aggregate(L, mask, "seq_mean_token_sum"), 3.5)  # (3+4)/2
    close(ops.aggregate(L, mask, "seq_mean_token_mean"), 2.75)  # (1.5+4)/2
    close(ops.aggregate(L, mask, "seq_mean_token_sum_norm"), 7 / 6)  # (3/3+4/3)/2, max_len = T = 3
    close(ops.aggregate(L, mask, "seq_mean_token_sum_norm", max_len=4), 0.875)  # (3/4+4/4)/2
    close(ops.aggregate(L, mask, "seq-mean-token-mean"), 2.75)  # verl spelling
    # explicit denominators: token_mean with 7 tokens -> 7/7; seq modes with 4 sequences
    close(ops.aggregate(L, mask, "token_mean", num_tokens=7), 1.0)
    close(ops.aggregate(L, mask, "seq_mean_token_sum", num_seqs=4), 7 / 4)
    assert ops.aggregate(L, mask, "token_mean").dtype == dtype


def test_aggregate_empty_sequence_no_nan():
    L, _ = agg_case()
    mask = torch.tensor([[True, True, False], [False, False, False]])
    # row1 has no valid token: its mean counts as 0 -> (1.5 + 0)/2
    close(ops.aggregate(L, mask, "seq_mean_token_mean"), 0.75)
    for mode in ops.AGG_MODES:
        assert torch.isfinite(ops.aggregate(L, torch.zeros_like(mask), mode))


def test_aggregate_unknown_mode():
    L, mask = agg_case()
    with pytest.raises(ValueError, match="token_mean"):
        ops.aggregate(L, mask, "sum")


@pytest.mark.parametrize("mode", ops.AGG_MODES)
@pytest.mark.parametrize("split", [2, 1, 3])
def test_aggregate_microbatch_identity(mode, split):
    gen = torch.Generator().manual_seed(7)
    B, T = 4, 5
    w_full = torch.randn(B, T, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = ragged_mask(gen, B, T)
    mask[0, 0] = True
    full = ops.aggregate(w_full**2, mask, mode)
    full.backward()

    w_mb = w_full.detach().clone().requires_grad_(True)
    n_tok, n_seq = float(mask.sum()), B
    total = 0.0
    for sl in (slice(0, split), slice(split, B)):
        part = ops.aggregate(w_mb[sl] ** 2, mask[sl], mode, num_tokens=n_tok, num_seqs=n_seq, max_len=T)
        part.backward()  # gradient accumulation
        total = total + part.detach()
    close(total, full.detach(), 1e-12)
    close(w_mb.grad, w_full.grad, 1e-12)


# --------------------------------------------------------------------------- kl, value loss


def test_kl_penalty_values():
    # d = logp - ref = log(0.5) - log(0.25) = ln 2 = 0.6931472
    # k1 = 0.6931472, abs = 0.6931472, k2 = 0.5*ln2^2 = 0.2402265
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 + 0.6931472 - 1 = 0.1931472
    # reversed (d = -ln 2): k1 = -0.6931472, abs 0.6931472, k2 0.2402265, k3 = 2 - 0.6931472 - 1 = 0.3068528
    logp = torch.log(t([[0.5, 0.25]]))
    ref = torch.log(t([[0.25, 0.5]]))
    close(ops.kl_penalty(logp, ref, "k1"), [[0.6931472, -0.6931472]])
    close(ops.kl_penalty(logp, ref, "abs"), [[0.6931472, 0.6931472]])
    close(ops.kl_penalty(logp, ref, "k2"), [[0.2402265, 0.2402265]])
    close(ops.kl_penalty(logp, ref, "k3"), [[0.1931472, 0.3068528]])
    close(ops.kl_penalty(logp, ref, "low_var_kl"), [[0.1931472, 0.3068528]])
    # k3 is clamped to 10 when the policy is far below the reference
    assert float(ops.kl_penalty(t([[-40.0]]), t([[0.0]]), "k3")) == 10.0
    with pytest.raises(ValueError, match="k3"):
        ops.kl_penalty(logp, ref, "k4")


def test_kl_penalty_k3_nonnegative_and_gradient():
    gen = torch.Generator().manual_seed(3)
    logp = torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    k3 = ops.kl_penalty(logp, ref, "k3")
    assert (k3 >= 0).all()
    k3.sum().backward()
    # d/dlogp [exp(ref-logp) - (ref-logp) - 1] = 1 - exp(ref - logp)
    close(logp.grad, 1 - torch.exp(ref - logp.detach()), 1e-10)


def test_value_loss_clipping():
    # clip = 0.2
    # tok0: V=1.0, V_old=0.5, R=2.0 -> V_clip = 0.7; (1-2)^2 = 1, (0.7-2)^2 = 1.69 -> 1.69 (clip active)
    # tok1: V=2.0, V_old=2.0, R=1.0 -> V_clip = 2.0; both 1 -> 1
    # tok2: V=3.0, V_old=3.1, R=2.0 -> V_clip = 3.0; both 1 -> 1
    # tok3: masked
    # loss = 0.5 * (1.69 + 1 + 1)/3 = 0.615; vf_clipfrac = 1/3
    values = t([[1.0, 2.0, 3.0, 50.0]]).requires_grad_(True)
    old = t([[0.5, 2.0, 3.1, 0.0]])
    ret = t([[2.0, 1.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = ops.value_loss(values, old, ret, mask, 0.2, return_stats=True)
    close(loss, 0.615)
    assert stats["vf_clipfrac"] == pytest.approx(1 / 3)
    loss.backward()
    # tok0 gradient flows through the clipped branch (constant) -> 0; tok2: 0.5*2*(3-2)/3 = 1/3
    assert float(values.grad[0, 0]) == 0.0
    close(values.grad[0, 2], 1 / 3)
    assert float(values.grad[0, 3]) == 0.0
    assert torch.is_tensor(ops.value_loss(values, old, ret, mask, 0.2))


# --------------------------------------------------------------------------- logits


@pytest.mark.parametrize("dtype", DTYPES)
def test_entropy_and_logprobs(dtype):
    close(ops.entropy_from_logits(torch.zeros(2, 4, dtype=dtype)), [math.log(4)] * 2)
    close(ops.entropy_from_logits(t([[1000.0, 1000.0, -math.inf]], dtype)), [math.log(2)])
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 3, 11, generator=gen) * 5).to(dtype).requires_grad_(True)
    labels = torch.randint(0, 11, (2, 3), generator=gen)
    ent = ops.entropy_from_logits(logits)
    lp = ops.logprobs_from_logits(logits, labels)
    assert ent.shape == lp.shape == (2, 3) and ent.dtype == lp.dtype == dtype
    close(ent, torch.distributions.Categorical(logits=logits.detach()).entropy(), 1e-5)
    close(lp, torch.log_softmax(logits.detach(), -1).gather(-1, labels[..., None])[..., 0], 1e-5)
    (ent.sum() + lp.sum()).backward()
    assert torch.isfinite(logits.grad).all()


def test_logits_half_precision_upcast():
    logits = torch.randn(3, 7).to(torch.bfloat16)
    assert ops.logprobs_from_logits(logits, torch.tensor([0, 1, 2])).dtype == torch.float32
    assert ops.entropy_from_logits(logits).dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_equal_the_autograd_graph(dtype, temperature, monkeypatch):
    """The chunked log-probs, entropy and logits gradient equal the plain formulas' (chunks of 2
    positions here, so rows split mid-sequence), -inf logits included."""
    monkeypatch.setattr(ops, "_CHUNK_ELEMENTS", 2 * 11)
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(3, 5, 11, generator=gen) * 4
    base[0, 1, 4] = -math.inf  # a banned token: probability 0, no NaN anywhere
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    labels[0, 1] = 0
    weights = torch.randn(3, 5, generator=gen)
    chunked_in = base.to(dtype).clone().requires_grad_(True)
    plain_in = base.to(dtype).clone().requires_grad_(True)
    logp, ent = ops.logprobs_entropy_chunked(chunked_in, labels, temperature, with_entropy=True)
    (logp * weights).sum().backward()
    z = (plain_in.double() if dtype == torch.float64 else plain_in.float()) / temperature
    plain_logp, plain_ent = ops.logprobs_from_logits(z, labels), ops.entropy_from_logits(z)
    (plain_logp * weights).sum().backward()
    assert logp.dtype == plain_logp.dtype and not ent.requires_grad
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    close(logp, plain_logp.detach(), tol)
    close(ent, plain_ent.detach(), tol)
    assert chunked_in.grad.dtype == dtype and torch.isfinite(chunked_in.grad).all()
    close(chunked_in.grad.double(), plain_in.grad.double(), tol if dtype != torch.bfloat16 else 1e-2)
    # by hand at one position: d log p(y) / d z_v = ([v = y] - p_v) / T
    p = torch.softmax(base[2, 3].double() / temperature, -1)
    expected = (torch.nn.functional.one_hot(labels[2, 3], 11).double() - p) * weights[2, 3] / temperature
    close(chunked_in.grad[2, 3].double(), expected, 1e-5 if dtype != torch.bfloat16 else 2e-2)
    assert ops.logprobs_entropy_chunked(base, labels)[1] is None


# --------------------------------------------------------------------------- masking invariance


@FAST
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 6))
def test_property_masked_positions_never_matter(seed, B, T):
    gen = torch.Generator().manual_seed(seed)
    mask = ragged_mask(gen, B, T)

    def rnd():
        return torch.randn(B, T, generator=gen, dtype=torch.float64)

    r, v, logp, old, adv, loss_mat = rnd(), rnd(), rnd(), rnd(), rnd(), rnd()
    junk = [rnd() * 100 for _ in range(6)]

    def perturb(x, j):
        return torch.where(mask, x, j)

    r2, v2, logp2, old2, adv2, loss2 = (perturb(x, j) for x, j in zip((r, v, logp, old, adv, loss_mat), junk))

    for a, b in zip(ops.gae(r, v, mask, 0.95, 0.9), ops.gae(r2, v2, mask, 0.95, 0.9)):
        close(a, b, 1e-10)
    close(ops.discounted_returns(r, mask, 0.9), ops.discounted_returns(r2, mask, 0.9), 1e-10)
    s1 = ops.clipped_surrogate(logp, old, adv, mask, 0.2, 0.28, dual_clip=3.0, return_stats=True)
    s2 = ops.clipped_surrogate(logp2, old2, adv2, mask, 0.2, 0.28, dual_clip=3.0, return_stats=True)
    close(s1[0], s2[0], 1e-10)
    for k in s1[1]:
        assert s1[1][k] == pytest.approx(s2[1][k], rel=1e-9, abs=1e-12)
    for mode in ops.AGG_MODES:
        close(ops.aggregate(loss_mat, mask, mode), ops.aggregate(loss2, mask, mode), 1e-10)
    close(ops.value_loss(v, old, r, mask, 0.2), ops.value_loss(v2, old2, r2, mask, 0.2), 1e-10)
    if mask.sum() >= 2:
        close(ops.masked_whiten(v, mask)[mask], ops.masked_whiten(v2, mask)[mask], 1e-10)
    # zero at masked positions
    assert (ops.gae(r, v, mask, 0.95, 0.9)[0][~mask] == 0).all()
    assert (s1[0][~mask] == 0).all()


def test_last_token_mask_and_outcome_at_last_token_with_holes():
    mask = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert ops.last_token_mask(mask).tolist() == [[False, False, True, False], [False] * 4, [False, False, False, True]]
    out = ops.outcome_at_last_token(torch.tensor([-1.0, 5.0, 2.0]), mask)
    assert out.tolist() == [[0.0, 0.0, -1.0, 0.0], [0.0] * 4, [0.0, 0.0, 0.0, 2.0]]
    assert not torch.signbit(out[0, 0])  # +0.0 off the last token, also for negative scores


def test_reward_kl_is_masked_float32_and_never_leaks_padding():
    logp = torch.tensor([[-1.0, -2.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -float("inf")]])  # -inf at padding
    kl = ops.reward_kl(logp, ref, torch.tensor([[1, 1, 0]]), "k1")
    assert kl.dtype == torch.float32 and kl.tolist() == [[0.5, -1.0, 0.0]]
