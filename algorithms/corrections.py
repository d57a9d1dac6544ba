"""Rollout-training mismatch corrections: per-token weights of the policy-gradient term.

The rollout engine samples from pi_rollout; the trainer's pi_old (the same weights, or the
weights the batch was generated with, when pipelined) assigns the sampled tokens other
log-probabilities: other kernels or precision, stale weights, truncated sampling. Each
correction turns the token log-ratio

    l_t = old_logp_t - rollout_logp_t,   r_t = exp(l_t)   (pi_old / pi_rollout)

into a weight w_t >= 0 of token t's policy-gradient term (0 drops the token); no gradient
flows through it. ``correction.name`` names one (``none``, the default: no weights),
``correction.cap`` is its upper bound C and ``correction.low`` its lower bound:

============  ======================================================================  ===============
name          weight                                                                  bounds
============  ======================================================================  ===============
none          1                               no correction                           -
tis           min(r_t, C)                     token truncated IS (Yao et al. 2025)    C = correction.cap
mask          r_t if lo <= r_t <= C else 0    token masked IS (MIS)                   lo >= 0 (0: C only)
icepop        r_t if lo <= r_t <= C else 0    IcePop (Ring-1T, arXiv 2510.18855)      lo > 0 required
seq_tis       min(R_i, C) on every token      sequence truncated IS (as published)    C
seq_mis       R_i if lo <= R_i <= C else 0    sequence masked IS                      lo >= 0, C
seq_geo_tis   min(g_i, C) on every token      truncated IS on the geometric mean      C
seq_mask      1 if lo <= g_i <= C else 0      geometric-mean rejection (no weights)   lo, C
token_veto    1 if min_t r_t >= lo else 0     token veto (verl's token_veto_threshold) lo > 0
reject_k1     1 if |mean_t l_t| <= C else 0   sequence rejection by the k1 estimate   C in nats/token
reject_k3     1 if mean_t (r_t - 1 - l_t) <= C else 0  rejection by the k3 estimate   C in nats/token
============  ======================================================================  ===============

R_i = prod_t r_t = exp(sum_t l_t) is sequence i's importance ratio, the weight of sequence-level
IS in verl's rollout correction and in "When Speed Kills Stability" (Liu et al. 2025): the
product, capped, computed in log space so it never overflows (log R_i is compared with log C).
g_i = exp(mean_t l_t) is its geometric mean, a per-token average whose threshold means the same
for short and long responses: verl uses it to reject sequences, not to weigh them (``seq_mask``
here); ``seq_geo_tis`` weighs by it, and was called ``seq_tis`` before 2026-12-07. k1 and k3 are
Schulman's estimators ("Approximating KL Divergence", 2020) of KL(pi_rollout || pi_old) per
token, from the rollout's own samples; k3 is never negative, k1 is, so its magnitude is compared.

By default every rejected token (weight 0) stays in the loss's denominator (the response-token count
of the minibatch, as for a token with a zero advantage), and the KL-to-reference and entropy terms
still act on it. ``correction.exclude_rejected=true`` takes rejected tokens off the response mask
before the update instead (verl's way): out of the denominator and of the KL and entropy terms
(harness/runtime/workers/worker.py ``_exclude_rejected``). Group statistics (GRPO's mean and std)
include rejected sequences either way: advantages are computed before the correction.

Bounds are inclusive and compared in log space (a ratio exactly on a bound is kept).

IcePop is the band of ``mask`` with a lower edge: a separate name because peers' configs (NeMo-RL
``icepop``) use it, and it refuses a zero lower bound, which would make it one-sided.

A plugin registers its own with ``@register_correction(name, summary)`` on a function
``(old_logp, rollout_logp, mask, low, high) -> [B, T] weights``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from algorithms.ops import _LOG_RATIO_CLAMP, _mask_as, truncated_is_weight
from harness.core.registry import Registry

Weigh = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, float], torch.Tensor]
REGISTRY: Registry[Weigh] = Registry(
    "correction", entry_point_group="harness.corrections", setting="correction.name",
    how_to_add="Register your own with @register_correction and load it with plugins=[your.module]",
)


def register_correction(name: str, summary: str, needs_low: str = "") -> Callable[[Weigh], Weigh]:
    """Decorator: ``@register_correction("my_is", "one line")`` on ``f(old, rollout, mask, low, high)``.
    ``needs_low``: why the correction needs a lower bound > 0 (config validation refuses low = 0 with it)."""

    def wrap(fn: Weigh) -> Weigh:
        REGISTRY.add(name, fn)
        fn.summary = summary
        fn.needs_low = needs_low
        return fn

    return wrap


def available_corrections() -> dict[str, str]:
    """name -> one-line summary of every registered correction."""
    return {name: fn.summary for name, fn in REGISTRY.entries().items()}


def correction_weights(name: str, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                       low: float, high: float) -> torch.Tensor:  # fmt: skip
    """[B, T] weights of correction ``name`` (0 at masked positions and at dropped tokens), no gradient."""
    weigh = REGISTRY.get(name)
    if high <= 0:
        raise ValueError(f"the correction's upper bound must be > 0, got {high}")
    with torch.no_grad():
        return weigh(old_logp.detach().float(), rollout_logp.detach().float(), mask, low, high)


def log_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] l_t = old_logp - rollout_logp, clamped above (exp must stay finite), 0 at masked positions."""
    return (old_logp - rollout_logp).clamp(max=_LOG_RATIO_CLAMP) * _mask_as(mask, old_logp)


def _per_sequence(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] mean of ``values`` over each sequence's response tokens (0 for an empty response)."""
    m = _mask_as(mask, values)
    return (values * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def _on_tokens(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_sequence[:, None] * _mask_as(mask, per_sequence)


@register_correction("none", "no correction: every token weighs 1 (the mismatch is still measured)")
def _none(old, rollout, mask, low, high):
    return _mask_as(mask, old).clone()


@register_correction("tis", "token truncated IS: min(r, C)")
def _tis(old, rollout, mask, low, high):
    return truncated_is_weight(old, rollout, mask, high)


def _log_bound(bound: float, like: torch.Tensor) -> torch.Tensor:
    """log(bound) in ``like``'s dtype (-inf for 0): bounds are compared with log-ratios in log space, so a ratio
    exactly on a bound (its log rounded to the same float) is inside, whatever exp would round it to."""
    return torch.tensor(math.log(bound) if bound > 0 else -math.inf, dtype=like.dtype)


def _band(old, rollout, mask, low, high):
    lr = log_ratio(old, rollout, mask)
    keep = (lr >= _log_bound(low, lr)) & (lr <= _log_bound(high, lr))
    return torch.where(keep, torch.exp(lr), torch.zeros_like(lr)) * _mask_as(mask, old)


@register_correction("mask", "token masked IS (MIS): r if lo <= r <= C, else the token is dropped")
def _mask(old, rollout, mask, low, high):
    return _band(old, rollout, mask, low, high)


@register_correction("icepop", "IcePop: r if lo <= r <= C, else dropped (two-sided; lo > 0)",
                     needs_low="IcePop masks both sides; its paper: 0.5), or use correction.name=mask for an upper bound only")
def _icepop(old, rollout, mask, low, high):
    if low <= 0:
        raise ValueError("icepop masks both sides: give it a lower bound > 0 (correction.low, e.g. 0.5)")
    return _band(old, rollout, mask, low, high)


def sequence_log_ratio(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] log R_i = sum_t l_t, the log of sequence i's importance ratio (0 for an empty response)."""
    return log_ratio(old, rollout, mask).sum(-1)


@register_correction("seq_tis", "sequence truncated IS: min(prod_t r_t, C) on every token (as published)")
def _seq_tis(old, rollout, mask, low, high):
    return _on_tokens(torch.exp(sequence_log_ratio(old, rollout, mask).clamp(max=math.log(high))), mask)


@register_correction("seq_mis", "sequence masked IS: prod_t r_t if lo <= it <= C, else the sequence is dropped")
def _seq_mis(old, rollout, mask, low, high):
    log_rho = sequence_log_ratio(old, rollout, mask)
    keep = (log_rho <= _log_bound(high, log_rho)) & (log_rho >= _log_bound(low, log_rho))
    return _on_tokens(torch.where(keep, torch.exp(log_rho.clamp(max=math.log(high))), torch.zeros_like(log_rho)), mask)


@register_correction("seq_geo_tis", "min(geometric-mean ratio, C) on every token (seq_tis before 2026-12-07)")
def _seq_geo_tis(old, rollout, mask, low, high):
    rho = torch.exp(_per_sequence(log_ratio(old, rollout, mask), mask))
    return _on_tokens(rho.clamp(max=high), mask)


@register_correction("seq_mask", "geometric-mean rejection: keep (weight 1) a sequence whose geometric-mean ratio is in [lo, C]")
def _seq_mask(old, rollout, mask, low, high):
    rho = torch.exp(_per_sequence(log_ratio(old, rollout, mask), mask))
    return _on_tokens(((rho >= low) & (rho <= high)).float(), mask)


@register_correction("token_veto", "token veto: drop a sequence in which any token's r < lo (weight 1 otherwise)",
                     needs_low="the floor under which one token vetoes its sequence, e.g. 0.1)")
def _token_veto(old, rollout, mask, low, high):
    """verl's rollout_token_veto_threshold: one token the trainer finds far less likely than the rollout did
    (r_t < lo) rejects its whole sequence; a sequence kept is weighted 1 (combine with nothing: a rejection)."""
    if low <= 0:
        raise ValueError("token_veto drops a sequence with any token ratio under a floor: give it correction.low "
                         "> 0 (e.g. 0.1)")  # fmt: skip
    lr = log_ratio(old, rollout, mask)
    vetoed = ((lr < _log_bound(low, lr)) & mask.bool()).any(-1)
    return _on_tokens((~vetoed).float(), mask)


@register_correction("reject_k1", "rejection: drop a sequence whose |k1| divergence exceeds C nats/token")
def _reject_k1(old, rollout, mask, low, high):
    k1 = _per_sequence(log_ratio(old, rollout, mask), mask).abs()
    return _on_tokens((k1 <= high).float(), mask)


@register_correction("reject_k3", "rejection: drop a sequence whose k3 divergence exceeds C nats/token")
def _reject_k3(old, rollout, mask, low, high):
    lr = log_ratio(old, rollout, mask)
    k3 = _per_sequence(torch.exp(lr) - 1.0 - lr, mask)
    return _on_tokens((k3 <= high).float(), mask)


def correction_stats(weights: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, cap: float,
                     name: str) -> dict[str, float]:  # fmt: skip
    """What a step logs of its correction, over the response tokens of one micro-batch (the step's value is
    the token-weighted mean over micro-batches): the mean weight, the fraction dropped (weight 0), the
    fraction clipped at the cap (tis, seq_tis, seq_geo_tis) or dropped (the others), and the 5/50/95% quantiles of the
    token ratio r = pi_old / pi_rollout (1 everywhere when the two agree)."""
    w, ratio = weights[mask].float(), torch.exp(log_ratio[mask].float())
    if not w.numel():
        return {}
    dropped = float((w == 0).float().mean())
    clipped = float((w >= cap).float().mean()) if name in ("tis", "seq_tis", "seq_geo_tis") else dropped
    q = torch.quantile(ratio, torch.tensor([0.05, 0.5, 0.95]))
    return {"rollout/tis_weight_mean": float(w.mean()), "rollout/tis_capped_frac": clipped,
            "rollout/correction_dropped_frac": dropped, "rollout/ratio_p05": float(q[0]),
            "rollout/ratio_p50": float(q[1]), "rollout/ratio_p95": float(q[2])}  # fmt: skip


def token_mismatch_stats(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Per-token divergence of the trainer's pi_old from the rollout's pi_rollout over one micro-batch's
    response tokens, from the rollout's own samples (l = log r, r = pi_old / pi_rollout): k1 = mean(-l)
    and k3 = mean(r - 1 - l) estimate KL(pi_rollout || pi_old) (Schulman 2020; k3 >= 0), chi2 = mean((r - 1)^2)
    estimates chi^2(pi_old || pi_rollout). The step's value is the token-weighted mean over micro-batches,
    i.e. the mean over all its response tokens."""
    lr = log_ratio(old_logp.float(), rollout_logp.float(), mask)[mask]
    if not lr.numel():
        return {}
    r = torch.exp(lr)
    return {"mismatch/k1": float((-lr).mean()), "mismatch/k3": float((r - 1 - lr).mean()),
            "mismatch/chi2": float(((r - 1) ** 2).mean())}  # fmt: skip


def sequence_mismatch_stats(log_rho: torch.Tensor, mean_log_ratio: torch.Tensor,
                            rejected: torch.Tensor | None = None) -> dict[str, float]:  # fmt: skip
    """The step's per-sequence mismatch metrics from every response-bearing sequence's log R_i = sum_t l_t,
    its mean_t l_t and (with a correction on) whether the correction dropped all its tokens:

    - seq_k1 = mean(-log R), seq_k3 = mean(R - 1 - log R), seq_chi2 = mean((R - 1)^2): the same estimators as
      the token ones, on the sequence (log R capped at 20 nats so R stays finite);
    - ess: the normalised effective sample size of the sequence weights, (sum R)^2 / (n sum R^2), in (0, 1]
      (1 when every R is equal; 1/n when one sequence carries all the weight);
    - ppl_ratio: mean over sequences of the trainer's perplexity over the rollout's, exp(-mean_t l_t);
    - seq_ratio_p05/p50/p95: quantiles of R;
    - rejected_seq_frac: the fraction of sequences the correction dropped whole."""
    if not log_rho.numel():
        return {}
    w = torch.exp(log_rho.double() - log_rho.max())  # R / max R, uncapped: the ESS is scale-free, and this never overflows
    log_rho = log_rho.double().clamp(max=_LOG_RATIO_CLAMP)
    rho = torch.exp(log_rho)
    q = torch.quantile(rho, torch.tensor([0.05, 0.5, 0.95], dtype=rho.dtype))
    out = {"mismatch/seq_k1": float((-log_rho).mean()), "mismatch/seq_k3": float((rho - 1 - log_rho).mean()),
           "mismatch/seq_chi2": float(((rho - 1) ** 2).mean()),
           "mismatch/ess": float(w.sum() ** 2 / (len(w) * (w**2).sum())),
           "mismatch/ppl_ratio": float(torch.exp(-mean_log_ratio.double()).mean()),
           "mismatch/seq_ratio_p05": float(q[0]), "mismatch/seq_ratio_p50": float(q[1]),
           "mismatch/seq_ratio_p95": float(q[2])}  # fmt: skip
    if rejected is not None:
        out["mismatch/rejected_seq_frac"] = float(rejected.float().mean())
    return out
