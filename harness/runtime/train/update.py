"""The messages of one update, driver -> every worker -> driver, and the batch layout both sides use.

The driver sends every rank the same ``UpdateRequest``: the batch's rows, the seed of the minibatch
shuffle and the sizes. Each worker runs ``Worker.update`` (harness/runtime/workers/worker.py):
epochs > minibatches > its share of the minibatch > micro-batches > forward/backward > optimizer
step, in one function. It answers an ``UpdateResult`` of its partial sums; ``combine`` merges the
ranks' results into the step's metrics. Every rank derives the same shuffle and the same shares
from the seed, so no rank needs another's plan.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from algorithms import Batch
from algorithms.corrections import log_ratio, sequence_mismatch_stats, token_mismatch_stats
from harness.runtime.train.fsdp import attention_mask, response_lengths


@dataclass
class UpdateRequest:
    """What every rank gets for one model's update (the same object for all)."""

    model: str  # 'policy' or a trainable role's name
    batch: Batch
    loss_fn: Callable  # (outputs, entropy, MicroBatch) -> (loss, stats)
    epochs: int
    seed: int  # the minibatch shuffle's
    sequences_per_minibatch: int
    micro_batch_sequences: int
    micro_batch_tokens: int  # > 0: micro-batches by tokens too
    temperature: float
    entropy_grad: bool = True  # the policy's entropy reaches the loss with its gradient (else a metric only)


@dataclass
class UpdateResult:
    """One rank's partial sums of an update."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # stat x tokens, over micro-batches
    weights: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # the tokens each stat was weighted by
    grad_norms: list[float] = field(default_factory=list)  # per optimizer step: the global norm, the same on every rank
    lr: float = 0.0
    gap_max: float = 0.0  # |rollout engine - trainer| log-prob of the first epoch's tokens: max, sum, count
    gap_sum: float = 0.0
    gap_tokens: int = 0
    # The first epoch's response-bearing sequences (rollout log-probs present): sum_t and mean_t of the log-ratio
    # l = log pi_old - log pi_rollout, and (with a correction on) 1.0 where it dropped every token.
    seq_log_ratio: list[float] = field(default_factory=list)
    seq_mean_log_ratio: list[float] = field(default_factory=list)
    seq_rejected: list[float] = field(default_factory=list)

    def add(self, stats: dict[str, float], tokens: float) -> None:
        for key, value in stats.items():  # token-weighted means over the step
            self.sums[key] += float(value) * tokens
            self.weights[key] += tokens

    def add_gap(self, gap: torch.Tensor) -> None:
        if gap.numel():
            self.gap_max, self.gap_sum = max(self.gap_max, float(gap.max())), self.gap_sum + float(gap.sum())
            self.gap_tokens += gap.numel()


    def add_mismatch(self, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                     pg_weight: torch.Tensor | None) -> None:  # fmt: skip
        """One micro-batch's rollout-trainer mismatch: its token metrics (algorithms/corrections.py), weighted by
        its response tokens, and its sequences' log-ratios for the step's sequence metrics (``combine``)."""
        tokens = float(mask.sum())
        if not tokens:
            return
        self.add(token_mismatch_stats(old_logp, rollout_logp, mask), tokens)
        has_response = mask.any(-1)
        total = log_ratio(old_logp, rollout_logp, mask).sum(-1)
        self.seq_log_ratio += total[has_response].tolist()
        self.seq_mean_log_ratio += (total / mask.sum(-1).clamp(min=1))[has_response].tolist()
        if pg_weight is not None:
            self.seq_rejected += (pg_weight.sum(-1) == 0)[has_response].float().tolist()


def combine(parts: list[UpdateResult], prefix: str) -> dict[str, float]:
    """The step's metrics from every rank's result: token-weighted means, the mean finite grad norm,
    the optimizer steps skipped for a non-finite one, the learning rate, the rollout-trainer gap and the
    per-sequence mismatch metrics over every rank's sequences."""
    sums: dict[str, float] = defaultdict(float)
    weights: dict[str, float] = defaultdict(float)
    for part in parts:
        for key, value in part.sums.items():
            sums[key] += value
            weights[key] += part.weights[key]
    out = {key: sums[key] / max(weights[key], 1.0) for key in sums}
    finite = [g for g in parts[0].grad_norms if math.isfinite(g)]  # a non-finite one skipped its update
    out[f"{prefix}/grad_norm"] = sum(finite) / len(finite) if finite else float("nan")
    out["train/skipped_steps"] = len(parts[0].grad_norms) - len(finite)
    out[f"{prefix}/lr"] = parts[0].lr
    gap_tokens = sum(p.gap_tokens for p in parts)
    if gap_tokens:
        out["rollout/logp_gap_max"] = max(p.gap_max for p in parts)
        out["rollout/logp_gap_mean"] = sum(p.gap_sum for p in parts) / gap_tokens
    log_rho = [x for p in parts for x in p.seq_log_ratio]
    if log_rho:
        rejected = [x for p in parts for x in p.seq_rejected]
        out |= sequence_mismatch_stats(torch.tensor(log_rho), torch.tensor([x for p in parts for x in p.seq_mean_log_ratio]),
                                       torch.tensor(rejected) if rejected else None)  # fmt: skip
    return out


def split_rows(n: int, parts: int) -> list[torch.Tensor]:
    """``arange(n)`` in ``parts`` contiguous chunks, sizes differing by at most one."""
    return list(torch.arange(n).tensor_split(parts))


def sequence_tokens(batch: Batch) -> torch.Tensor:
    """[B] real tokens per sequence: the prompt's and the response span's."""
    return batch.prompt_mask.sum(-1) + response_lengths(attention_mask(batch))


def micro_batches(rows: torch.Tensor, tokens: torch.Tensor, max_sequences: int, max_tokens: int) -> list[torch.Tensor]:
    """Consecutive micro-batches of ``rows``: at most ``max_sequences`` rows each and, with ``max_tokens``
    > 0 (``trainer.micro_batch_tokens``), at most that many tokens (``tokens[row]``: its prompt and
    response-span tokens; a longer sequence goes alone)."""
    if not max_tokens:
        return list(rows.split(max_sequences))
    out, current, used = [], [], 0
    for r in rows.tolist():
        t = int(tokens[r])
        if current and (used + t > max_tokens or len(current) >= max_sequences):
            out.append(torch.tensor(current))
            current, used = [], 0
        current.append(r)
        used += t
    if current:
        out.append(torch.tensor(current))
    return out


def rank_micro_batches(rows: torch.Tensor, tokens: torch.Tensor, rank: int, world: int, max_sequences: int,
                       max_tokens: int) -> list[torch.Tensor | None]:  # fmt: skip
    """This rank's micro-batches of ``rows`` (its contiguous share), padded with None (a dummy pass) to the
    most any rank has: every rank makes the same number of forward/backward calls, so collectives match."""
    shares = [micro_batches(rows[c], tokens, max_sequences, max_tokens) for c in split_rows(len(rows), world)]
    mine = shares[rank]
    return mine + [None] * (max(len(s) for s in shares) - len(mine))
