"""How a micro-batch is laid out for the model: shared prompts and length buckets.

Both only change which rows go through which forward call; every row gets the outputs
it would get alone (causal attention, masked padding), so log-probs and gradients stay
those of the plain padded batch.
"""

from __future__ import annotations

import torch


def shared_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """Rows with identical prompts (ids and mask): (first row of each distinct prompt, row -> distinct index).

    None when every row's prompt is distinct (nothing to share).
    """
    key = prompt_ids.masked_fill(~prompt_mask, -1)
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    if distinct.shape[0] == key.shape[0]:
        return None
    rows = torch.arange(key.shape[0])
    first = torch.full((distinct.shape[0],), key.shape[0]).scatter_reduce(0, inverse, rows, "amin")
    return first, inverse


def length_buckets(lengths: torch.Tensor, min_saving: float = 0.1, max_buckets: int = 4) -> list[torch.Tensor]:
    """Rows split into groups of similar ``lengths``, each to be padded only to its own longest.

    Greedy: split the group whose best cut saves the most padded positions (rows x
    columns), while that saving is at least ``min_saving`` x the unsplit padded area
    (a forward call has a fixed cost too) and there are fewer than ``max_buckets``.
    Returns row indices per group, shortest group first, rows in ascending length.
    """
    order = torch.argsort(lengths, stable=True)
    ordered = lengths[order].long()
    n = len(ordered)
    if n == 0:
        return []
    threshold = min_saving * n * int(ordered[-1])
    bounds = [(0, n)]
    while len(bounds) < max_buckets:
        best = None  # (saving, which group, cut)
        for g, (a, b) in enumerate(bounds):
            if b - a < 2:
                continue
            group = ordered[a:b]
            before = torch.arange(1, b - a)  # rows left of the cut pad to group[cut-1], not group[-1]
            saving = before * (group[-1] - group[before - 1])
            k = int(saving.argmax())
            if best is None or saving[k] > best[0]:
                best = (int(saving[k]), g, a + k + 1)
        if best is None or best[0] <= 0 or best[0] < threshold:
            break
        _, g, cut = best
        a, b = bounds[g]
        bounds[g : g + 1] = [(a, cut), (cut, b)]
    return [order[a:b] for a, b in bounds]
