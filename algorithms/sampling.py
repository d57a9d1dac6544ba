"""Group filtering with regeneration, shared by DAPO (dynamic sampling) and PRIME (accuracy filter)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from algorithms.base import Batch

log = logging.getLogger(__name__)
# Consecutive batches in which no group passed, per prefix: a run stuck there gets no policy
# gradient at all (e.g. PRIME after its accuracy collapsed), which the user should hear about.
_empty_streak: dict[str, int] = {}


def _group_rows(batch: Batch) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = {}
    for i, g in enumerate(batch.group_ids.tolist()):
        rows.setdefault(g, []).append(i)
    return rows


def refill_groups(
    batch: Batch,
    keep_group: Callable[[torch.Tensor], bool],
    sample_more: Callable[[], Batch],
    max_rounds: int,
    prefix: str,
) -> tuple[Batch, dict[str, float]]:
    """Keep the groups whose scores pass ``keep_group``; sample more rounds until the batch
    has as many groups as it started with, or ``max_rounds`` generation rounds were used.

    The result always has the original number of groups (extra kept groups are dropped;
    if still short after ``max_rounds``, rejected groups fill the gap, so batch sizes stay
    divisible for minibatching; ``batch.filler`` marks their rows, so an algorithm can
    give them no weight). Group ids are renumbered 0..G-1. Returns the batch and metrics:
    ``{prefix}/sampling_rounds``, ``{prefix}/kept_group_frac`` (kept / examined groups),
    ``{prefix}/padded_groups`` (rejected groups used as filler).
    """
    target = len(_group_rows(batch))
    kept: list[Batch] = []
    rejected: list[Batch] = []
    examined, rounds, current = 0, 1, batch
    while True:
        for rows in _group_rows(current).values():
            group = current.select(torch.tensor(rows))
            examined += 1
            (kept if keep_group(group.scores) else rejected).append(group)
        if len(kept) >= target or rounds >= max_rounds:
            break
        current = sample_more()
        rounds += 1
    n_kept = min(len(kept), target)
    streak = _empty_streak[prefix] = (_empty_streak.get(prefix, 0) + 1) if n_kept == 0 else 0
    if streak and (streak in (1, 10) or streak % 100 == 0):  # a step that kept groups is silent
        log.warning("%s: no group passed the filter in %d generation round(s), %d batch(es) in a row: "
                    "this step has no policy gradient (filler only)", prefix, rounds, streak)
    groups = kept[:target] + rejected[: target - n_kept]
    for gid, group in enumerate(groups):
        group.group_ids = torch.full_like(group.group_ids, gid)
    out = Batch.concat(groups)
    out.filler = torch.tensor([i >= n_kept for i, g in enumerate(groups) for _ in range(len(g))])
    return out, {
        f"{prefix}/sampling_rounds": float(rounds),
        f"{prefix}/kept_group_frac": len(kept) / max(examined, 1),
        f"{prefix}/padded_groups": float(target - n_kept),
    }
