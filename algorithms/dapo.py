"""DAPO: Decoupled Clip and Dynamic sAmpling Policy Optimization.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476.

Objective: GRPO's group-normalised outcome advantage

    A_i = (R_i - mean(R_1..G)) / (std(R_1..G) + eps)

with the clipped surrogate aggregated over *all tokens of the batch* (token_mean),
no KL term, and four changes:

1. Clip-higher: rho is clipped to [1 - eps_low, 1 + eps_high] = [0.8, 1.28], so
   low-probability tokens can still grow (keeps entropy from collapsing).
2. Dynamic sampling (``select``): groups whose scores all agree (all right or all
   wrong) have zero advantage and no gradient; they are dropped and fresh prompts are
   sampled (``sampler.more()``) until the batch has as many informative groups as it
   started with.
3. Token-level loss (``loss_agg=token_mean``): every token weighs the same, so long
   responses are not down-weighted.
4. Overlong reward shaping: with L_max the generation limit and L_cache a soft buffer,
   R_i = score_i + penalty * clip(((L_max - L_cache) - |y_i|) / L_cache, -1, 0), i.e. 0
   up to L_max - L_cache tokens, then a linear penalty reaching -penalty at L_max.

Conventions and deviations:

* Dynamic sampling is capped at ``extra_sampling_rounds`` extra generation rounds (the
  paper keeps sampling until the batch is full). If still short, the batch is padded
  with dropped zero-variance groups (earliest first) so it always has exactly the
  original number of groups (minibatch sizes stay valid); padded groups have zero
  advantage unless overlong shaping separates their scores. Extra informative groups
  beyond the target are discarded (earliest kept first). Group ids are renumbered
  0..G-1. Zero variance is judged on the checker score, before shaping (the paper
  filters on accuracy). The mechanics are shared with PRIME (algorithms/sampling.py);
  ``select`` returns the metrics ``dapo/sampling_rounds`` (generation rounds,
  1 = no regeneration), ``dapo/kept_group_frac`` (informative / examined groups),
  ``dapo/padded_groups``.
* L_max for shaping: ``max_response_tokens`` if > 0, else
  ``batch.max_response_tokens`` when the rollout records it, else the padded response width
  when some response was truncated (a truncated response is exactly L_max long). If
  none of these is known (no response truncated and no recorded limit) the batch is
  not shaped (every response is then shorter than L_max; logged as
  ``dapo/overlong_l_max = 0``). L_cache = ``overlong_buffer_tokens`` or, if 0,
  ``overlong_buffer_frac`` x L_max (the paper: 4096 of 20480 = 0.2), at least 1.
* The shaped reward only feeds the advantage; ``batch.scores`` keeps the checker score.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from algorithms import ops, register_algorithm
from algorithms.base import AlgoConfig, Algorithm, Batch, Sampler
from algorithms.parts import param, register_filter, register_shaping
from algorithms.sampling import refill_groups


@dataclass
class DAPOConfig(AlgoConfig):
    name: str = "dapo"
    samples_per_prompt: int = 16  # G, responses per prompt (paper: 16)
    loss_agg: str = "token_mean"  # token-level policy-gradient loss
    clip_low: float = 0.2  # eps_low
    clip_high: float = 0.28  # eps_high (clip-higher)
    kl_coef: float = 0.0  # the paper removes the KL term
    eps: float = 1e-6  # added to the group std
    extra_sampling_rounds: int = 3  # extra sampler.more() rounds per step for dynamic sampling (0 = off)
    overlong_penalty: float = 1.0  # overlong shaping factor: penalty at L_max (0 = no shaping)
    overlong_buffer_tokens: int = 0  # L_cache in tokens; 0 = overlong_buffer_frac x L_max
    overlong_buffer_frac: float = 0.2  # L_cache / L_max when overlong_buffer_tokens = 0 (paper: 4096/20480)
    max_response_tokens: int = 0  # L_max for shaping; 0 = the rollout's limit (see module doc)
    shaping: str = "overlong"  # the overlong shaping below (algorithms/parts.py hooks)
    filter: str = "dynamic"  # dynamic sampling below


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float) -> torch.Tensor:
    """DAPO soft overlong punishment, [B]: 0 if |y| <= L_max - L_cache, linear down to -factor at L_max."""
    expected = max_len - buffer
    return ((expected - lengths.to(torch.float32)) / buffer).clamp(-1.0, 0.0) * factor


@register_algorithm("dapo", summary="clip-higher, dynamic sampling, token-level loss, overlong shaping (2503.14476)")
class DAPO(Algorithm):
    config_class = DAPOConfig
    metadata = {
        "baseline": "group mean",
        "normalisation": "group std",
        "kl": "none",
        "aggregation": "token_mean",
        "extra models": "none",
        "extra generation": "dynamic sampling: up to extra_sampling_rounds extra batches",
    }

    def overlong_max_len(self, batch: Batch) -> int:
        return overlong_max_len(self, batch)

    def shaped_scores(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        return overlong_shaping(self, batch)

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Group-normalised advantages of the scores, which ``algo.shaping`` (overlong) has shaped."""
        adv = ops.group_normalized_advantage(batch.scores, batch.group_ids, eps=self.cfg.eps)
        return adv[:, None] * batch.response_mask, {}


# ---------------------------------------------------------------- dynamic sampling
@register_filter("dynamic", "keep the groups whose scores differ, refill from fresh prompts (DAPO's dynamic "
                 "sampling, 2503.14476)", extra_sampling_rounds=3)  # fmt: skip
def dynamic_sampling(algo: Algorithm, batch: Batch, sampler: Sampler) -> tuple[Batch, dict[str, float]]:
    rounds = 1 + int(param(algo, "dynamic", "extra_sampling_rounds"))
    return refill_groups(batch, lambda s: bool(s.max() > s.min()), sampler.more, rounds, "dapo")


# ---------------------------------------------------------------- overlong shaping
def overlong_max_len(algo: Algorithm, batch: Batch) -> int:
    """L_max for overlong shaping, 0 when unknown (see module doc)."""
    configured = int(param(algo, "overlong", "max_response_tokens"))
    if configured > 0:
        return configured
    if batch.max_response_tokens:
        return int(batch.max_response_tokens)
    if bool(batch.truncated.any()):
        return int(batch.response_ids.shape[1])
    return 0


@register_shaping("overlong", "DAPO's soft overlong punishment: 0 up to L_max - L_cache, linear down to -factor at "
                  "L_max (2503.14476)", overlong_penalty=1.0, overlong_buffer_tokens=0, overlong_buffer_frac=0.2,
                  max_response_tokens=0)  # fmt: skip
def overlong_shaping(algo: Algorithm, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Checker score + overlong penalty, [B]; and metrics."""
    factor = param(algo, "overlong", "overlong_penalty")
    scores = batch.scores.float()
    max_len = overlong_max_len(algo, batch) if factor else 0
    metrics = {"dapo/overlong_l_max": float(max_len)}
    if max_len <= 0:
        return scores, metrics
    buffer = param(algo, "overlong", "overlong_buffer_tokens") or round(param(algo, "overlong", "overlong_buffer_frac")
                                                                        * max_len)  # fmt: skip
    buffer = max(1, min(int(buffer), max_len))
    lengths = batch.attention_mask.sum(-1)  # the response span: an episode's observations fill the cap too
    penalty = overlong_penalty(lengths, max_len, buffer, factor)
    metrics["dapo/overlong_penalty_mean"] = float(penalty.mean())
    return scores + penalty, metrics
