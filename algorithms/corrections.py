"""Rollout-training mismatch corrections: per-token weights of the policy-gradient term.

The rollout engine samples from pi_rollout; the trainer's pi_old (the same weights, or the
weights the batch was generated with, when pipelined) assigns the sampled tokens other
log-probabilities: other kernels or precision, stale weights, truncated sampling. Each
correction turns the token log-ratio

    l_t = old_logp_t - rollout_logp_t,   r_t = exp(l_t)   (pi_old / pi_rollout)

into a weight w_t >= 0 of token t's policy-gradient term (0 drops the token); no gradient
flows through it. ``rollout.correction`` names one, ``rollout.tis_cap`` (> 0 turns it on) is
its upper bound and ``rollout.correction_low`` its lower bound:

============  ======================================================================  ===============
name          weight                                                                  bounds
============  ======================================================================  ===============
tis           min(r_t, C)                     token truncated IS (Yao et al. 2025)    C = tis_cap
mask          r_t if lo <= r_t <= C else 0    token masked IS (MIS)                   lo >= 0 (0: C only)
icepop        r_t if lo <= r_t <= C else 0    IcePop (Ring-1T, arXiv 2510.18855)      lo > 0 required
seq_tis       min(rho_i, C) on every token    sequence truncated IS                   C
seq_mask      1 if lo <= rho_i <= C else 0    sequence masking (no reweighting)       lo, C
reject_k1     1 if |mean_t l_t| <= C else 0   sequence rejection by the k1 estimate   C in nats/token
reject_k3     1 if mean_t (r_t - 1 - l_t) <= C else 0  rejection by the k3 estimate   C in nats/token
============  ======================================================================  ===============

rho_i = exp(mean_t l_t) is sequence i's geometric-mean ratio (a product over 100 tokens would
over- or underflow, and its length dependence would make one threshold mean different things
for short and long responses). k1 and k3 are Schulman's estimators ("Approximating KL
Divergence", 2020) of KL(pi_rollout || pi_old) per token, from the rollout's own samples; k3
is never negative, k1 is, so its magnitude is compared. IcePop is the band of ``mask`` with a
lower edge: a separate name because peers' configs (NeMo-RL ``icepop``) use it, and it refuses
a zero lower bound, which would make it one-sided.

A plugin registers its own with ``@register_correction(name, summary)`` on a function
``(old_logp, rollout_logp, mask, low, high) -> [B, T] weights``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from algorithms.ops import _LOG_RATIO_CLAMP, _mask_as, truncated_is_weight
from harness.core.registry import Registry

Weigh = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, float], torch.Tensor]
REGISTRY: Registry[Weigh] = Registry(
    "correction", entry_point_group="harness.corrections", setting="rollout.correction",
    how_to_add="Register your own with @register_correction and load it with plugins=[your.module]",
)


def register_correction(name: str, summary: str) -> Callable[[Weigh], Weigh]:
    """Decorator: ``@register_correction("my_is", "one line")`` on ``f(old, rollout, mask, low, high)``."""

    def wrap(fn: Weigh) -> Weigh:
        REGISTRY.add(name, fn)
        fn.summary = summary
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


@register_correction("tis", "token truncated IS: min(r, C)")
def _tis(old, rollout, mask, low, high):
    return truncated_is_weight(old, rollout, mask, high)


def _band(old, rollout, mask, low, high):
    ratio = torch.exp(log_ratio(old, rollout, mask))
    keep = (ratio >= low) & (ratio <= high)
    return torch.where(keep, ratio, torch.zeros_like(ratio)) * _mask_as(mask, old)


@register_correction("mask", "token masked IS (MIS): r if lo <= r <= C, else the token is dropped")
def _mask(old, rollout, mask, low, high):
    return _band(old, rollout, mask, low, high)


@register_correction("icepop", "IcePop: r if lo <= r <= C, else dropped (two-sided; lo > 0)")
def _icepop(old, rollout, mask, low, high):
    if low <= 0:
        raise ValueError("icepop masks both sides: give it a lower bound > 0 (rollout.correction_low, e.g. 0.5)")
    return _band(old, rollout, mask, low, high)


@register_correction("seq_tis", "sequence truncated IS: min(geometric-mean ratio, C) on every token")
def _seq_tis(old, rollout, mask, low, high):
    rho = torch.exp(_per_sequence(log_ratio(old, rollout, mask), mask))
    return _on_tokens(rho.clamp(max=high), mask)


@register_correction("seq_mask", "sequence masking: keep (weight 1) a sequence whose geometric-mean ratio is in [lo, C]")
def _seq_mask(old, rollout, mask, low, high):
    rho = torch.exp(_per_sequence(log_ratio(old, rollout, mask), mask))
    return _on_tokens(((rho >= low) & (rho <= high)).float(), mask)


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
    fraction clipped at the cap (tis, seq_tis) or dropped (the others), and the 5/50/95% quantiles of the
    token ratio r = pi_old / pi_rollout (1 everywhere when the two agree)."""
    w, ratio = weights[mask].float(), torch.exp(log_ratio[mask].float())
    if not w.numel():
        return {}
    dropped = float((w == 0).float().mean())
    clipped = float((w >= cap).float().mean()) if name in ("tis", "seq_tis") else dropped
    q = torch.quantile(ratio, torch.tensor([0.05, 0.5, 0.95]))
    return {"rollout/tis_weight_mean": float(w.mean()), "rollout/tis_capped_frac": clipped,
            "rollout/correction_dropped_frac": dropped, "rollout/ratio_p05": float(q[0]),
            "rollout/ratio_p50": float(q[1]), "rollout/ratio_p95": float(q[2])}  # fmt: skip
