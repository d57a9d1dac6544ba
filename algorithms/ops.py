"""Shared RL math for every algorithm in the harness (pure torch).

Conventions used throughout:

* ``[B, T]`` tensors are token-level (batch x response tokens), ``[B]`` tensors are
  per sequence.
* ``mask`` is ``[B, T]``, bool or float with values in {0, 1}; it is converted to the
  dtype of the values it weights. A position with mask 0 is *padding*: it never
  influences a result at a valid position, and token-level outputs are 0 there
  (except :func:`masked_whiten`, which leaves masking to the caller).
* ``group_ids`` is a ``LongTensor [B]`` of arbitrary ids (neither contiguous nor
  sorted); rows sharing an id were sampled for the same prompt.
* Inputs are never modified in place. Everything works for float32 and float64;
  losses are differentiable with respect to ``logp`` / ``values``.

Each function cites the paper whose formula it implements (arXiv ids).
"""

from __future__ import annotations

import math

import torch

from algorithms.parts import AGGREGATIONS, KL_ESTIMATORS, register_aggregation, register_kl_estimator

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "aggregate",
    "clipped_surrogate",
    "discounted_returns",
    "entropy_from_logits",
    "gae",
    "group_index",
    "group_normalized_advantage",
    "high_entropy_mask",
    "kl_penalty",
    "leave_one_out_advantage",
    "logprobs_from_logits",
    "logprobs_entropy_chunked",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "token_covariance",
    "truncated_is_weight",
    "uniform_group_rows",
    "uniform_groups",
    "value_loss",
]

AGG_MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_KINDS = ("k1", "abs", "k2", "k3")

# log-ratio clamp before exp(): keeps ratios finite for wildly off-policy tokens.
_LOG_RATIO_CLAMP = 20.0


# --------------------------------------------------------------------------- helpers


def _float_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """Common floating dtype of ``tensors`` (default dtype if none is floating)."""
    dtype = None
    for t in tensors:
        if torch.is_tensor(t) and t.is_floating_point():
            dtype = t.dtype if dtype is None else torch.promote_types(dtype, t.dtype)
    return dtype if dtype is not None else torch.get_default_dtype()


def _mask_as(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``mask`` as a tensor of ``like``'s dtype and device."""
    return torch.as_tensor(mask, device=like.device).to(like.dtype)


def _safe_count(count: torch.Tensor) -> torch.Tensor:
    """Denominator that is 1 where ``count`` is 0 (the matching sum is 0 there too)."""
    return torch.where(count > 0, count, torch.ones_like(count))


def _nonzero(denom):
    """A python or tensor denominator, with 0 replaced by 1 (its numerator is 0 then)."""
    if torch.is_tensor(denom):
        return _safe_count(denom)
    return denom if denom else 1


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum_i m_i x_i over ``dim`` (all elements if ``None``)."""
    m = _mask_as(mask, x)
    prod = torch.where(m != 0, x * m, torch.zeros_like(x))  # NaN/inf at padding never leaks
    return prod.sum() if dim is None else prod.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over valid entries: sum_i m_i x_i / sum_i m_i.

    Reduces over ``dim`` (all elements if ``None``). Where there is no valid entry the
    result is 0 rather than NaN.
    """
    m = _mask_as(mask, x)
    count = m.sum() if dim is None else m.sum(dim)
    return masked_sum(x, m, dim) / _safe_count(count)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid entries of ``x`` (all dims reduced).

    var = sum_i m_i (x_i - mean)^2 / (n - 1)   (unbiased, Bessel's correction; n = sum_i m_i)
    var = sum_i m_i (x_i - mean)^2 / n         (``unbiased=False``)

    Raises ``ValueError`` when there is no valid entry, or exactly one with
    ``unbiased=True`` (the variance is undefined there).
    """
    m = _mask_as(mask, x)
    n = float(m.sum())
    if n == 0:
        raise ValueError("masked_var: the mask has no valid entry")
    if unbiased and n == 1:
        raise ValueError("masked_var: unbiased variance needs at least two valid entries (mask sums to 1)")
    mean = masked_mean(x, m)
    sq = masked_sum((x - mean) ** 2, m)
    return sq / (n - 1 if unbiased else n)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Whiten ``x`` with statistics of its valid entries only.

    y = (x - mean) / sqrt(var + eps),  mean/var over valid tokens, var unbiased.
    With ``shift_mean=False`` the mean is added back: y = (x - mean) / sqrt(var + eps) + mean
    (rescale only). Values are returned at *all* positions (masked ones included, computed
    with the same statistics); the caller applies the mask.
    """
    m = _mask_as(mask, x)
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=True)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out


def group_index(group_ids, device: torch.device | None = None) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to ``(inverse [B] in 0..G-1, G)``.

    Accepts a tensor of ids, or any sequence of hashables (e.g. string uids).
    """
    if not torch.is_tensor(group_ids):
        try:
            group_ids = torch.as_tensor(group_ids)
        except (TypeError, ValueError, RuntimeError):
            ids: dict = {}
            group_ids = torch.tensor([ids.setdefault(g, len(ids)) for g in group_ids], dtype=torch.long)
    if device is not None:
        group_ids = group_ids.to(device)
    uniq, inverse = torch.unique(group_ids.reshape(-1), return_inverse=True)
    return inverse, int(uniq.numel())


def _group_stats(scores: torch.Tensor, group_ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (group size n, group mean, sum of squared deviations in the group)."""
    inverse, g = group_index(group_ids, scores.device)
    if inverse.numel() != scores.shape[0]:
        raise ValueError(f"group_ids has {inverse.numel()} entries, scores has {scores.shape[0]}")
    zeros = torch.zeros(g, dtype=scores.dtype, device=scores.device)
    counts = zeros.index_add(0, inverse, torch.ones_like(scores))
    sums = zeros.index_add(0, inverse, scores)
    mean = sums / counts
    dev = scores - mean[inverse]
    sq = zeros.index_add(0, inverse, dev * dev)
    return counts[inverse], mean[inverse], sq[inverse]


def _as_scores(scores) -> torch.Tensor:
    scores = torch.as_tensor(scores)
    if not scores.is_floating_point():
        scores = scores.to(torch.get_default_dtype())
    if scores.dim() != 1:
        raise ValueError(f"scores must be [B], got shape {tuple(scores.shape)}")
    return scores


# --------------------------------------------------------------------------- advantages


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438).

    Backward recursion over the valid tokens of each row::

        delta_t = r_t + gamma * V_{t'} - V_t
        A_t     = delta_t + gamma * lam * A_{t'}
        R_t     = A_t + V_t

    where t' is the next *valid* position after t (V_{t'} = A_{t'} = 0 past the last
    valid token: the episode terminates there). Positions with mask 0 are skipped: they
    contribute nothing and carry the next value and the running advantage through
    unchanged, so interior padding does not break the recursion. Advantages are NOT
    whitened. Both outputs are 0 at masked positions.

    Returns ``(advantages [B, T], returns [B, T])``; no gradient flows (values are targets).
    """
    with torch.no_grad():
        dtype = _float_dtype(token_rewards, values)
        r = token_rewards.to(dtype)
        v = values.to(dtype)
        m = _mask_as(mask, v)
        valid = m != 0
        B, T = v.shape
        next_value = torch.zeros(B, dtype=dtype, device=v.device)
        running = torch.zeros(B, dtype=dtype, device=v.device)
        cols = [None] * T
        for t in range(T - 1, -1, -1):
            vt = v[:, t]
            delta = r[:, t] + gamma * next_value - vt
            adv_t = delta + gamma * lam * running
            ok = valid[:, t]
            running = torch.where(ok, adv_t, running)
            next_value = torch.where(ok, vt, next_value)
            cols[t] = running
        adv = torch.stack(cols, dim=1) if T else torch.zeros_like(v)
        zero = torch.zeros_like(adv)
        returns = torch.where(valid, (adv + v) * m, zero)
        adv = torch.where(valid, adv * m, zero)
    return adv, returns


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted reward-to-go G_t = r_t + gamma * G_{t'} (REINFORCE++, Hu 2025, arXiv:2501.03262).

    t' is the next valid position (G = 0 past the last valid token). Masked positions
    are skipped like in :func:`gae` (their reward is ignored and the running return is
    carried through them); the output is 0 there.
    """
    with torch.no_grad():
        r = token_rewards.to(_float_dtype(token_rewards))
        m = _mask_as(mask, r)
        valid = m != 0
        B, T = r.shape
        running = torch.zeros(B, dtype=r.dtype, device=r.device)
        cols = [None] * T
        for t in range(T - 1, -1, -1):
            running = torch.where(valid[:, t], r[:, t] + gamma * running, running)
            cols[t] = running
        out = torch.stack(cols, dim=1) if T else torch.zeros_like(r)
        out = torch.where(valid, out * m, torch.zeros_like(out))
    return out


def group_normalized_advantage(
    scores: torch.Tensor, group_ids, eps: float = 1e-6, scale_by_std: bool = True
) -> torch.Tensor:
    """GRPO outcome advantage (Shao et al. 2024, arXiv:2402.03300), one value per sequence.

    A_i = (s_i - mean_g) / (std_g + eps)   with std_g the UNBIASED std of the group of i
    (``torch.std`` default, divisor n - 1).

    ``scale_by_std=False`` gives A_i = s_i - mean_g: Dr. GRPO (Liu et al. 2025,
    arXiv:2503.20783) drops the std division, which biases toward too-easy/too-hard prompts.

    Groups of size 1 (verl convention): mean 0 and std 1, so A_i = s_i / (1 + eps) (the
    raw score up to eps), or exactly s_i with ``scale_by_std=False``. A group whose scores
    are all equal gets advantage 0.
    """
    scores = _as_scores(scores)
    n, mean, sq = _group_stats(scores, group_ids)
    single = n <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    centred = scores - mean
    if not scale_by_std:
        return centred
    var = sq / torch.where(single, torch.ones_like(n), n - 1)
    std = torch.where(single, torch.ones_like(var), var.sqrt())
    return centred / (std + eps)


def uniform_groups(scores: torch.Tensor, group_ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(uniform [G] bool: the group's scores are all equal, a group of one included; count [G]; inverse [B]):
    the one place that decides whether a group carries a signal (zero-std groups, GPG's alpha)."""
    scores = _as_scores(scores)
    inverse, g = group_index(group_ids, scores.device)
    empty = torch.zeros(g, dtype=scores.dtype, device=scores.device)
    high = empty.scatter_reduce(0, inverse, scores, "amax", include_self=False)
    low = empty.scatter_reduce(0, inverse, scores, "amin", include_self=False)
    count = empty.index_add(0, inverse, torch.ones_like(scores))
    return high == low, count, inverse


def uniform_group_rows(scores: torch.Tensor, group_ids) -> torch.Tensor:
    """[B] bool: rows whose group (of 2 or more) has all-equal scores, so every group-relative advantage
    there is 0 (all right or all wrong under a 0/1 checker)."""
    uniform, count, inverse = uniform_groups(scores, group_ids)
    return uniform[inverse] & (count > 1)[inverse]


def leave_one_out_advantage(scores: torch.Tensor, group_ids) -> torch.Tensor:
    """RLOO advantage (Ahmadian et al. 2024, arXiv:2402.14740; Kool et al. 2019, "Buy 4
    REINFORCE samples, get a baseline for free!").

    A_i = s_i - 1/(n-1) * sum_{j != i, j in g} s_j = n/(n-1) * (s_i - mean_g)

    for a group g of size n. Groups of size 1 have no other sample to build a baseline
    from: A_i = s_i (raw score). Within a group of size > 1 the advantages sum to 0.
    """
    scores = _as_scores(scores)
    n, mean, _ = _group_stats(scores, group_ids)
    single = n <= 1
    scale = n / torch.where(single, torch.ones_like(n), n - 1)
    return torch.where(single, scores, scale * (scores - mean))


# --------------------------------------------------------------------------- losses


def clipped_surrogate(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
    return_stats: bool = False,
):
    """PPO clipped surrogate, per token, as a loss to MINIMISE.

    PPO (Schulman et al. 2017, arXiv:1707.06347), with the decoupled clip range
    ("clip-higher") of DAPO (Yu et al. 2025, arXiv:2503.14476) and the dual clip of
    Ye et al. 2020 (arXiv:1912.09729)::

        rho_t = exp(logp_t - old_logp_t)
        l_t   = max(-A_t * rho_t, -A_t * clip(rho_t, 1 - clip_low, 1 + clip_high))
        l_t   = min(l_t, -A_t * c)        if dual_clip = c (> 1) and A_t < 0

    (the dual clip bounds the loss of negative-advantage tokens whose ratio exploded).
    ``advantages`` may be ``[B, T]`` or ``[B]`` (broadcast over T). The log-ratio is
    clamped to [-20, 20] before exp. The loss is 0 at masked positions.

    With ``return_stats=True`` returns ``(loss, stats)``; stats are python floats over
    valid tokens: ``clipfrac`` (fraction where the clipped branch is strictly larger,
    i.e. active), ``approx_kl`` (mean of old_logp - logp), ``dual_clipfrac`` (fraction
    where the dual clip is active), ``ratio_mean``, ``ratio_max``.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    adv = torch.as_tensor(advantages, device=logp.device).to(logp.dtype)
    if adv.dim() == logp.dim() - 1:
        adv = adv.unsqueeze(-1)
    m = _mask_as(mask, logp)
    valid = m != 0
    log_ratio = (logp - old_logp.to(logp.dtype)).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_active = None
    if dual_clip is not None:
        bound = -adv * dual_clip
        dual_active = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    loss = torch.where(valid, loss * m, torch.zeros_like(loss))
    if not return_stats:
        return loss
    with torch.no_grad():
        vm = valid.expand_as(loss)
        clip_active = (clipped > unclipped).to(logp.dtype)
        dual = dual_active.to(logp.dtype) if dual_active is not None else torch.zeros_like(loss)
        r = ratio.detach()
        stats = {
            "clipfrac": float(masked_mean(clip_active, m)),
            "approx_kl": float(masked_mean(-log_ratio.detach(), m)),
            "dual_clipfrac": float(masked_mean(dual, m)),
            "ratio_mean": float(masked_mean(r, m)),
            "ratio_max": float(r[vm].max()) if bool(vm.any()) else 0.0,
        }
    return loss, stats


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar.

    Modes (m = mask, L = loss_mat, N_tok = sum m, N_seq = B)::

        token_mean              sum_{b,t} m L / N_tok                       (DAPO token-level)
        seq_mean_token_sum      sum_b (sum_t m L) / N_seq
        seq_mean_token_mean     sum_b (sum_t m L / sum_t m) / N_seq          (GRPO original)
        seq_mean_token_sum_norm sum_b (sum_t m L / max_len) / N_seq          (Dr. GRPO, arXiv:2503.20783)

    ``max_len`` is a constant (default ``T = loss_mat.shape[1]``). ``num_tokens`` /
    ``num_seqs``, when given, replace N_tok / N_seq: aggregating each micro-batch of a
    minibatch with the minibatch's totals and summing gives exactly the full-minibatch
    aggregate (and gradient), which keeps gradient accumulation exact. A sequence with
    no valid token contributes 0 (never NaN). Hyphenated verl spellings
    ("seq-mean-token-mean") are accepted.
    """
    key = mode.replace("-", "_") if isinstance(mode, str) else mode
    if key not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation mode {mode!r}{AGGREGATIONS.did_you_mean(str(key))}; valid modes: "
                         f"{', '.join(AGGREGATIONS.names())}")
    return AGGREGATIONS.get(key).fn(loss_mat, _mask_as(mask, loss_mat), num_tokens, num_seqs, max_len)


@register_aggregation("token_mean", "sum over every token / the tokens (DAPO)")
def _token_mean(loss_mat, m, num_tokens, num_seqs, max_len):
    if num_tokens is None:
        return masked_sum(loss_mat, m) / _safe_count(m.sum())
    return masked_sum(loss_mat, m) / _nonzero(num_tokens)


def _per_sequence_mean(per_seq: torch.Tensor, num_seqs: float | None) -> torch.Tensor:
    n_seq = per_seq.shape[0] if num_seqs is None else num_seqs
    return per_seq.sum() / _nonzero(n_seq)


@register_aggregation("seq_mean_token_sum", "each response's token sum, mean over responses")
def _seq_mean_token_sum(loss_mat, m, num_tokens, num_seqs, max_len):
    return _per_sequence_mean(masked_sum(loss_mat, m, dim=-1), num_seqs)


@register_aggregation("seq_mean_token_mean", "each response's token mean, mean over responses (GRPO)")
def _seq_mean_token_mean(loss_mat, m, num_tokens, num_seqs, max_len):
    return _per_sequence_mean(masked_sum(loss_mat, m, dim=-1) / _safe_count(m.sum(-1)), num_seqs)


@register_aggregation("seq_mean_token_sum_norm", "each response's token sum / a constant length, mean over responses "
                      "(Dr. GRPO)")  # fmt: skip
def _seq_mean_token_sum_norm(loss_mat, m, num_tokens, num_seqs, max_len):
    length = float(loss_mat.shape[-1] if max_len is None else max_len)
    return _per_sequence_mean(masked_sum(loss_mat, m, dim=-1) / length, num_seqs)


def token_covariance(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each token's term of the covariance between log-probability and advantage (Cui et al. 2025,
    "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", arXiv:2505.22617)::

        Cov_t = (logp_t - mean(logp)) * (A_t - mean(A))      means over the valid tokens given

    The paper shows the entropy change of a step follows this covariance; Clip-Cov and KL-Cov act on
    the tokens where it is largest. ``advantages`` may be ``[B, T]`` or ``[B]``. No gradient flows;
    the output is 0 at masked positions (and everywhere when no token is valid).
    """
    with torch.no_grad():
        lp = logp.detach()
        adv = torch.as_tensor(advantages, device=lp.device).to(lp.dtype)
        if adv.dim() == lp.dim() - 1:
            adv = adv.unsqueeze(-1).expand_as(lp)
        m = _mask_as(mask, lp)
        cov = (lp - masked_mean(lp, m)) * (adv - masked_mean(adv, m))
        return torch.where(m != 0, cov, torch.zeros_like(cov))


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, frac: float) -> torch.Tensor:
    """``[B, T]`` bool: the valid tokens whose entropy is among the top ``frac`` of the valid tokens given
    (the "forking" tokens of Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
    Effective Reinforcement Learning for LLM Reasoning", arXiv:2506.01939: the policy gradient is kept only
    where H_t >= tau, tau the entropy of the ceil(frac x N)-th highest of the N valid tokens; tokens tied
    at tau are all kept). ``frac`` >= 1 keeps every valid token, 0 none."""
    valid = _mask_as(mask, entropy) != 0
    n = int(valid.sum())
    k = min(n, math.ceil(frac * n - 1e-9)) if frac > 0 else 0
    if k == 0:
        return torch.zeros_like(valid)
    tau = torch.topk(entropy.detach()[valid], k).values[-1]
    return valid & (entropy.detach() >= tau)


def truncated_is_weight(
    old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance-sampling weight for the rollout/trainer mismatch, per token.

    Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
    Training" (fengyao.notion.site/off-policy-rl): the rollout engine (e.g. vLLM) samples
    from pi_rollout, which differs numerically from the trainer's pi_old with the same
    weights; weighting each token's policy-gradient loss by

        w_t = min(exp(old_logp_t - rollout_logp_t), cap)

    corrects the bias, the cap bounding the variance. No gradient flows through ``w``;
    it is 0 at masked positions.
    """
    if cap <= 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    log_ratio = (old_logp.detach() - rollout_logp.detach().to(old_logp.dtype)).clamp(max=_LOG_RATIO_CLAMP)
    return torch.exp(log_ratio).clamp(max=cap) * _mask_as(mask, old_logp)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimator of KL(pi || pi_ref) from samples of pi, ``[B, T]``.

    Estimators from Schulman (2020), "Approximating KL Divergence" (joschu.net blog),
    with d = logp - ref_logp::

        k1   d                               unbiased, high variance, can be negative
        abs  |d|
        k2   0.5 * d^2                       low variance, biased
        k3   exp(-d) - (-d) - 1              unbiased, low variance, >= 0  ("low_var_kl")

    k3 clamps -d to [-20, 20] before exp and the result to [-10, 10] for numerical
    safety. Aliases: "kl" = k1, "mse" = k2, "low_var_kl" = k3. The caller masks.
    """
    if kind not in KL_ESTIMATORS:
        valid = ", ".join(KL_ESTIMATORS.names())
        raise ValueError(f"unknown KL estimator {kind!r}{KL_ESTIMATORS.did_you_mean(str(kind))}; valid kinds: {valid}")
    return KL_ESTIMATORS.get(kind).fn(logp, ref_logp.to(logp.dtype))


@register_kl_estimator("k1", "d = logp - ref_logp: unbiased, high variance", aliases=("kl",))
def _k1(logp, ref):
    return logp - ref


@register_kl_estimator("abs", "|d|")
def _abs(logp, ref):
    return (logp - ref).abs()


@register_kl_estimator("k2", "d^2 / 2: low variance, biased", aliases=("mse",))
def _k2(logp, ref):
    d = logp - ref
    return 0.5 * d * d


@register_kl_estimator("k3", "exp(-d) + d - 1: unbiased, low variance, >= 0", aliases=("low_var_kl",))
def _k3(logp, ref):
    neg = (ref - logp).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return (torch.exp(neg) - neg - 1.0).clamp(-10.0, 10.0)


def reward_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, kind: str) -> torch.Tensor:
    """[B, T] per-token KL estimate (``kl_penalty`` of ``kind``, in float32) of the behaviour
    policy against the reference, 0 off the response: the KL term that PPO, REINFORCE++, RLOO
    and ReMax fold into their rewards (each logs its mean per response token as ``reward/kl``)."""
    kl = kl_penalty(logp.float(), ref_logp.float(), kind)
    m = _mask_as(mask, kl)
    return torch.where(m != 0, kl * m, torch.zeros_like(kl))


def last_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: True at each row's last response token (rows without one: all False)."""
    m = torch.as_tensor(mask).bool()
    counts = m.long().cumsum(-1)
    return m & (counts == counts[..., -1:])


def outcome_at_last_token(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] token rewards: each row's score on its last response token, 0 elsewhere."""
    last = last_token_mask(mask)
    return torch.where(last, scores[:, None].expand(last.shape), torch.zeros((), dtype=scores.dtype))


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float,
    return_stats: bool = False,
    *,
    mode: str = "token_mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
):
    """PPO clipped value loss (Schulman et al. 2017, arXiv:1707.06347; as in OpenAI baselines)::

        V_clip = clip(V, V_old - clip, V_old + clip)
        loss   = 0.5 * mean_{valid t} max((V - R)^2, (V_clip - R)^2)

    The token mean can be changed with ``mode`` / ``num_tokens`` / ``num_seqs`` (see
    :func:`aggregate`, e.g. for exact gradient accumulation). With ``return_stats=True``
    returns ``(loss, {"vf_clipfrac": fraction of valid tokens where the clipped term is
    strictly larger})``.
    """
    old = old_values.to(values.dtype)
    ret = returns.to(values.dtype)
    v_clip = old + (values - old).clamp(-clip, clip)
    l1 = (values - ret) ** 2
    l2 = (v_clip - ret) ** 2
    per_tok = torch.maximum(l1, l2)
    loss = 0.5 * aggregate(per_tok, mask, mode, num_tokens=num_tokens, num_seqs=num_seqs)
    if not return_stats:
        return loss
    with torch.no_grad():
        stats = {"vf_clipfrac": float(masked_mean((l2 > l1).to(values.dtype), mask))}
    return loss, stats


# --------------------------------------------------------------------------- logits


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """float16/bfloat16 -> float32; float32/float64 unchanged."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        return logits.float()
    return logits


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, shape ``logits.shape[:-1]``.

    H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v   (p = softmax(z)),

    computed on z - max(z) (H is shift-invariant) so large logits lose no precision; vocabulary entries with logit -inf contribute 0.
    Half-precision logits are upcast to float32.
    """
    z = _upcast(logits)
    # shift by the (detached) row max so lse and sum_v p_v z_v stay small: no cancellation
    zmax = z.detach().amax(dim=-1, keepdim=True)
    z = z - torch.where(torch.isfinite(zmax), zmax, torch.zeros_like(zmax))
    lse = torch.logsumexp(z, dim=-1)
    p = torch.softmax(z, dim=-1)
    pz = torch.where(torch.isneginf(z), torch.zeros_like(z), p * z)
    return lse - pz.sum(-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] over the last dim, shape ``labels.shape``.

    log p(y) = z_y - logsumexp(z): gathers one logit per position instead of
    materialising the full log-softmax. Half-precision logits are upcast to float32.
    """
    z = _upcast(logits)
    picked = z.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


# Rows of logits one chunk of ``logprobs_entropy_chunked`` works on at a time: ~16 MiB of fp32 at a
# 151,936-token vocabulary (Qwen2), so its temporaries stay small beside a [B, T, V] tensor.
_CHUNK_ELEMENTS = 1 << 22


def _chunks(logits: torch.Tensor):
    """(b, t0, t1) views over ``logits`` [B, T, V], about ``_CHUNK_ELEMENTS`` each (no reshape copies)."""
    rows = max(1, _CHUNK_ELEMENTS // max(logits.shape[-1], 1))
    for b in range(logits.shape[0]):
        for t0 in range(0, logits.shape[1], rows):
            yield b, t0, min(t0 + rows, logits.shape[1])


class _ChunkedLogprobs(torch.autograd.Function):
    """log p(y) of ``logits / temperature`` with a backward that keeps no [B, T, V] temporaries.

    The autograd graph of ``z_y - logsumexp(z)`` keeps a [B, T, V] exp(z - lse) and a scattered
    one-hot gradient beside the logits, and an entropy metric adds a softmax and a p * z of the
    same size: at a 152k vocabulary and 512-token responses each is 0.3 GB per sequence (fp32).
    Here the forward walks the logits in chunks and saves only the per-position logsumexp; the
    backward recomputes p = softmax(z) chunk by chunk into the one gradient tensor autograd
    needs anyway:  d log p(y) / d z_v = ([v = y] - p_v) / temperature.
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature, with_entropy):
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        logp = torch.empty(logits.shape[:-1], dtype=dtype, device=logits.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp) if with_entropy else None
        for b, t0, t1 in _chunks(logits):
            z = _upcast(logits[b, t0:t1]) / temperature  # a new fp32 chunk (so never the caller's tensor)
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[b, t0:t1] = chunk_lse
            logp[b, t0:t1] = z.gather(-1, labels[b, t0:t1, None]).squeeze(-1) - chunk_lse
            if with_entropy:  # entropy_from_logits' arithmetic, on the chunk
                entropy[b, t0:t1] = entropy_from_logits(z)
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature = temperature
        if with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable  # lse is saved as a constant: no double backward
    def backward(ctx, grad_logp, _grad_entropy):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for b, t0, t1 in _chunks(logits):
            z = _upcast(logits[b, t0:t1]) / ctx.temperature
            g = grad_logp[b, t0:t1].to(z.dtype)
            d = torch.exp(z - lse[b, t0:t1, None]).mul_(-g[:, None])  # -p_v * g
            d.scatter_add_(-1, labels[b, t0:t1, None], g[:, None])  # + g at v = y
            grad[b, t0:t1] = d.div_(ctx.temperature)
        return grad, None, None, None


def logprobs_entropy_chunked(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                             with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(y) [B, T], entropy [B, T] or None) of softmax(logits / temperature), in chunks.

    Equal to :func:`logprobs_from_logits` and :func:`entropy_from_logits` of ``logits / temperature``
    up to float rounding (tests), with the log-prob's gradient; the entropy is a metric here (no
    gradient: an entropy bonus needs :func:`entropy_from_logits`). Memory beside ``logits`` [B, T, V]:
    [B, T] vectors and one chunk; the backward adds the [B, T, V] gradient of ``logits`` only.
    Half-precision logits are upcast chunk by chunk (their gradient keeps their dtype).
    """
    return _ChunkedLogprobs.apply(logits, labels.long(), float(temperature or 1.0), bool(with_entropy))


MASKED_LOGIT = -1e9  # outside a replayed kept set: exp underflows to 0, and 0 x logit stays finite (entropy)


def replay_kept_set(logits: torch.Tensor, labels: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """``logits`` [B, T, V] with every token outside the rollout sampler's kept set set to ``MASKED_LOGIT``:
    mask replay (``rollout.mask_replay``; DeepSeek-V3.2's "keep sampling mask", arXiv 2512.02556 §3.1).

    ``kept`` [B, T]: the size of the set top-p / top-k kept at each token when it was sampled, which is the
    ``kept`` highest-scoring tokens (both cut the sorted distribution; temperature does not reorder it). The
    trainer rebuilds it from its own logits: its ``kept``-th highest logit is the threshold, and the sampled
    token ``labels`` is always kept (the rollout's and trainer's logits may order two near-equal tokens at the
    boundary differently; the sampled one was in the rollout's set by definition). ``kept`` 0: nothing was
    cut (padding, or no truncation): the row's logits are left whole. A log-softmax of the result is the
    truncated policy the rollout sampled from, and its gradient flows only through kept tokens."""
    kept = kept.to(logits.device).long()
    cut = kept > 0
    if not bool(cut.any()):
        return logits
    vocab = logits.shape[-1]
    k = kept.clamp(1, vocab)
    scores = logits.detach()
    top = scores.topk(int(k.max()), dim=-1).values  # [B, T, max kept], descending
    threshold = top.gather(-1, (k - 1).unsqueeze(-1))
    keep = scores >= threshold
    keep.scatter_(-1, labels.to(logits.device).long().unsqueeze(-1), True)
    keep |= ~cut.unsqueeze(-1)
    return logits.masked_fill(~keep, MASKED_LOGIT)
