"""Partial rollouts: a generation that a weight push may interrupt (``rollout.partial``, async pipeline).

A batch is generated in segments of at most ``rollout.partial_chunk_tokens`` tokens per sequence.
Between two segments the producer calls ``checkpoint()``, which lets a waiting weight push through
(``RolloutPipeline.yield_to_push``) and returns the policy version the engine holds afterwards. When
the version moved, the unfinished sequences

* ``continue``: keep their tokens and go on from them under the new weights (the prompt and the
  tokens so far are the next segment's context, as token ids: nothing is re-tokenized), or
* ``restart``: are dropped and sampled again from their prompts under the new weights (their
  tokens still count in the run's generated-token budget, and in ``discarded_tokens``).

Every response token carries the version that sampled it (``token_version``) and its log-prob under
that version (``rollout_logp``), so a loss that uses behaviour log-probs uses each token's own, and
staleness is measured per token. A push waits for the segment in flight instead of the whole batch
(or, arriving after the last one, for the batch's scoring and the algorithm's ``select``, which hold
the engine too): the chunk size trades that wait against the re-prefill of each continued sequence
(hf has no cache across calls; vLLM's prefix cache serves it until the weights move, and is reset
when they do).

Interruptible generation as in AReaL (Fu et al. 2025, arXiv:2505.24298, Sec. 4: generation requests
are interrupted by a weight update and continue with the new weights, recomputing the KV cache) and
the partial rollouts of Kimi k1.5 (arXiv:2501.12599, Sec. 2.6.2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.runtime.rollout.base import Generation

PARTIAL_MODES = ("off", "continue", "restart")


@dataclass
class Sequence:
    """One sampled sequence being generated: its prompt and what was generated so far."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the policy version that sampled each token
    eos: bool = False  # ended with an EOS token
    stalled: bool = False  # a segment gave it no token (e.g. its context filled the engine's window): ends here

    def add(self, ids: list[int], logps: list[float], version: int, eos_ids: list[int], cap: int) -> None:
        room = cap - len(self.tokens)
        ids, logps = ids[:room], logps[:room]  # a prefix of a sample is what a shorter cap would have sampled
        self.tokens += ids
        self.logps += logps
        self.versions += [version] * len(ids)
        self.eos = bool(ids) and ids[-1] in eos_ids
        self.stalled = not ids

    def done(self, cap: int) -> bool:
        return self.eos or self.stalled or len(self.tokens) >= cap


@dataclass
class PartialCounts:
    """What the interruptions of one generate call did."""

    segments: int = 0  # generate calls made
    interrupts: int = 0  # weight pushes let through while sequences were unfinished
    resumed: int = 0  # sequences with tokens from more than one version (continue)
    restarted: int = 0  # sequences dropped and sampled again (restart)
    discarded_tokens: int = 0  # tokens of restarted sequences: generated, counted in the budget, not trained on

    def add(self, other: PartialCounts) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def generate_in_segments(
    generate: Callable[[list, int, int, list[int] | None], Generation],
    prompts: list,
    n: int,
    max_tokens: int,
    seeds: list[int] | None,
    reseed: Callable[[int], list[int] | None],
    checkpoint: Callable[[], int],
    chunk_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    restart: bool = False,
) -> tuple[Generation, PartialCounts]:
    """``n`` samples per prompt of at most ``max_tokens`` tokens, generated ``chunk_tokens`` at a time.

    ``generate(prompts, n, max_tokens, seeds)``: one engine call (prompts as text or token ids).
    ``reseed(k)``: per-request seeds for a call of k continued sequences (None: the engine's RNG).
    ``checkpoint()``: let a waiting weight push through; the version the engine holds now.
    Returns the grouped ``Generation`` with ``token_version`` set, and what the interruptions did.
    """
    counts = PartialCounts(segments=1)
    version = checkpoint()
    first = generate(prompts, n, min(chunk_tokens, max_tokens), seeds)
    rows = [Sequence(ids[m].tolist()) for ids, m in zip(first.prompt_ids, first.prompt_mask)]
    _absorb(first, rows, list(range(len(rows))), version, eos_ids, max_tokens)
    while live := [i for i, row in enumerate(rows) if not row.done(max_tokens)]:
        now = checkpoint()
        if now != version:
            counts.interrupts += 1
            if restart:  # sample these sequences again, from their prompts, under the new weights
                for i in live:
                    counts.restarted += 1
                    counts.discarded_tokens += len(rows[i].tokens)
                    rows[i] = Sequence(rows[i].prompt)
            version = now
        room = max(max_tokens - len(rows[i].tokens) for i in live)
        gen = generate([rows[i].prompt + rows[i].tokens for i in live], 1, min(chunk_tokens, room), reseed(len(live)))
        counts.segments += 1
        _absorb(gen, rows, live, version, eos_ids, max_tokens)
    counts.resumed = sum(len(set(row.versions)) > 1 for row in rows)
    return _assemble(first, rows, eos_ids, pad_id), counts


def _absorb(gen: Generation, rows: list[Sequence], which: list[int], version: int, eos_ids: list[int],
            cap: int) -> None:  # fmt: skip
    for r, i in enumerate(which):
        mask = gen.response_mask[r]
        ids = gen.response_ids[r][mask].tolist()
        logps = gen.rollout_logp[r][mask].tolist() if gen.rollout_logp is not None else [float("nan")] * len(ids)
        rows[i].add(ids, logps, version, eos_ids, cap)


def _assemble(first: Generation, rows: list[Sequence], eos_ids: list[int], pad_id: int) -> Generation:
    """The segments of each row as one right-padded response (the first call's prompts and groups)."""
    width = max(1, max(len(row.tokens) for row in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    logp = torch.zeros((len(rows), width), dtype=torch.float32)
    versions = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        k = len(row.tokens)
        if k:
            ids[i, :k] = torch.tensor(row.tokens)
            mask[i, :k] = True
            logp[i, :k] = torch.tensor(row.logps)
            versions[i, :k] = torch.tensor(row.versions)
    known = not torch.isnan(logp).any()  # every segment reported its log-probs
    return Generation(
        prompt_ids=first.prompt_ids, prompt_mask=first.prompt_mask, response_ids=ids, response_mask=mask,
        truncated=torch.tensor([not row.eos for row in rows]), group_ids=first.group_ids,
        rollout_logp=logp if known else None, token_version=versions,
    )  # fmt: skip


def token_staleness(token_version: torch.Tensor, mask: torch.Tensor, trained_version: int) -> dict[str, float]:
    """Per-token staleness of a batch trained by version ``trained_version`` (= step - 1): mean and max
    age in versions, the share of tokens the current version sampled, and the share of sequences
    sampled by more than one version."""
    ages = (trained_version - token_version[mask]).float()
    if ages.numel() == 0:
        return {"rollout/staleness_mean": 0.0, "rollout/staleness_max": 0, "rollout/current_version_frac": 1.0,
                "rollout/partial_resumed_frac": 0.0}  # fmt: skip
    big = torch.iinfo(token_version.dtype).max
    newest = token_version.masked_fill(~mask, -1).max(1).values
    oldest = token_version.masked_fill(~mask, big).min(1).values
    return {
        "rollout/staleness_mean": float(ages.mean()),
        "rollout/staleness_max": int(ages.max()),
        "rollout/current_version_frac": float((ages == 0).float().mean()),
        "rollout/partial_resumed_frac": float((mask.any(1) & (newest > oldest)).float().mean()),
    }
