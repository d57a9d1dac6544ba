"""The algorithm protocol, the batch that flows through the loop, and the base config.

An algorithm only does tensor math on a ``Batch`` and declares which extra models or
passes it ``needs``; the runtime (harness/runtime) owns models, devices and generation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import torch

from algorithms import ops


@dataclass(frozen=True)
class Needs:
    """Extra models/passes an algorithm asks the engine for; it builds only these."""

    reference: bool = False  # frozen copy of the initial policy -> batch.ref_logp
    critic: bool = False  # value model -> batch.values
    greedy_baseline: bool = False  # one greedy rollout per prompt -> batch.greedy_scores
    prm: bool = False  # implicit process reward model (PRIME)
    old_logp: bool = True  # log-probs of the behaviour policy before the update
    # True when ``advantages`` reads old_logp/ref_logp (e.g. KL folded into the reward):
    # the engine then computes them before advantages even for on-policy updates.
    logp_before_advantages: bool = False
    critic_lr: float | None = None  # learning rate of the critic (None: trainer.lr)
    prm_lr: float | None = None  # learning rate of the implicit PRM (None: prm_lr_scale x trainer.lr)
    prm_lr_scale: float = 1.0


@dataclass
class Batch:
    """One step's rollouts. Token tensors cover the *response* tokens only: [B, T].

    B = prompts_per_step * samples_per_prompt sequences; samples of one prompt share a
    ``group_ids`` value. Prompts are left-padded, responses right-padded.
    """

    prompt_ids: torch.Tensor  # [B, P] long, left-padded
    prompt_mask: torch.Tensor  # [B, P] bool
    response_ids: torch.Tensor  # [B, T] long, right-padded
    response_mask: torch.Tensor  # [B, T] bool: real response tokens (incl. EOS)
    group_ids: torch.Tensor  # [B] long: index of the prompt within the step
    prompts: list[str]  # [B] rendered prompt text
    responses: list[str]  # [B] decoded response text (special tokens removed)
    ground_truths: list[str]  # [B]
    truncated: torch.Tensor  # [B] bool: hit max_response_tokens without EOS
    scores: torch.Tensor | None = None  # [B] float: checker reward
    correct: torch.Tensor | None = None  # [B] bool: checker verdict
    old_logp: torch.Tensor | None = None  # [B, T] behaviour-policy log-probs
    ref_logp: torch.Tensor | None = None  # [B, T] reference-model log-probs
    values: torch.Tensor | None = None  # [B, T] critic values
    greedy_scores: torch.Tensor | None = None  # [B] score of the greedy response of the same prompt
    token_rewards: torch.Tensor | None = None  # [B, T] if the algorithm shapes per-token rewards
    advantages: torch.Tensor | None = None  # [B, T]
    returns: torch.Tensor | None = None  # [B, T]
    extra: dict[str, Any] = field(default_factory=dict)  # algorithm-specific tensors

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def select(self, index: torch.Tensor) -> Batch:
        """Rows ``index`` of every per-sequence field (tensors, lists and ``extra`` tensors)."""
        idx = index.tolist()
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = _take(value, index, idx)
        return replace(self, **out)

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        """Row-wise concatenation; token tensors are right/left padded to a common width."""
        first = batches[0]
        out = {}
        for f in fields(first):
            values = [getattr(b, f.name) for b in batches]
            out[f.name] = _cat(f.name, values)
        return replace(first, **out)


def _take(value: Any, index: torch.Tensor, idx: list[int]) -> Any:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value[index]
    if isinstance(value, list):
        return [value[i] for i in idx]
    if isinstance(value, dict):
        return {k: _take(v, index, idx) for k, v in value.items()}
    return value


def _cat(name: str, values: list[Any]) -> Any:
    if values[0] is None:
        return None
    if isinstance(values[0], list):
        return [x for v in values for x in v]
    if isinstance(values[0], dict):
        return {k: _cat(k, [v[k] for v in values]) for k in values[0]}
    if isinstance(values[0], torch.Tensor):
        if values[0].dim() == 2:
            width = max(v.shape[1] for v in values)
            left = name.startswith("prompt")  # prompts are left-padded, the rest right-padded
            pad_id = 0
            padded = []
            for v in values:
                gap = width - v.shape[1]
                if gap:
                    pad = torch.full((v.shape[0], gap), pad_id, dtype=v.dtype)
                    v = torch.cat([pad, v], 1) if left else torch.cat([v, pad], 1)
                padded.append(v)
            return torch.cat(padded, 0)
        return torch.cat(values, 0)
    return values[0]


@dataclass
class MicroBatch:
    """A slice of a minibatch handed to ``Algorithm.loss``.

    ``minibatch_tokens``/``minibatch_seqs`` count the whole minibatch, so that losses
    aggregated with them and summed over micro-batches give exactly the full-minibatch
    gradient (see ops.aggregate).
    """

    batch: Batch
    minibatch_tokens: float
    minibatch_seqs: float
    max_response_tokens: int  # the constant length normaliser of seq_mean_token_sum_norm
    # [b, T] per-token weight of the policy-gradient term, set by the runtime (truncated
    # importance sampling of the rollout/trainer mismatch, ops.truncated_is_weight); None = 1.
    pg_weight: torch.Tensor | None = None


@dataclass
class AlgoConfig:
    """Fields every algorithm has. Subclasses add their own, with the paper's defaults."""

    name: str = "?"
    samples_per_prompt: int = 8  # responses sampled per prompt (group size)
    epochs: int = 1  # passes over each step's batch (PPO-style reuse)
    loss_agg: str = "token_mean"  # token_mean | seq_mean_token_sum | seq_mean_token_mean | seq_mean_token_sum_norm
    clip_low: float = 0.2  # ratio clip below: 1 - clip_low
    clip_high: float = 0.2  # ratio clip above: 1 + clip_high
    kl_coef: float = 0.0  # weight of the KL-to-reference term (0 = no reference model)
    kl_kind: str = "k3"  # k1 | abs | k2 | k3 (Schulman's estimators)
    entropy_coef: float = 0.0  # bonus on policy entropy (loss -= coef * entropy)


class Algorithm:
    """Base class; registered subclasses override what differs from the paper baseline."""

    config_class: ClassVar[type[AlgoConfig]] = AlgoConfig
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    # Descriptive metadata for docs/algorithms.md (generated, never hand-copied).
    metadata: ClassVar[dict[str, str]] = {}

    def __init__(self, cfg: AlgoConfig):
        self.cfg = cfg

    @property
    def samples_per_prompt(self) -> int:
        return self.cfg.samples_per_prompt

    @property
    def needs(self) -> Needs:
        """A reference when there is a KL term; with the KL in the reward, advantages read
        old/ref log-probs, so the engine must compute them before ``advantages``."""
        kl = self.cfg.kl_coef > 0
        return Needs(reference=kl, logp_before_advantages=kl and self.kl_placement == "reward")

    def select(self, batch: Batch, sample_more: Callable[[], Batch]) -> Batch:
        """Filter/regenerate rollouts (DAPO dynamic sampling, PRIME filter). Identity here.

        ``sample_more()`` returns another scored batch of ``prompts_per_step`` fresh prompts;
        an algorithm that drops groups calls it until it has enough (recording how many
        rounds it took in ``batch.extra``).
        """
        return batch

    def advantages(self, batch: Batch) -> torch.Tensor:  # pragma: no cover - abstract
        """[B, T] advantages (may also set batch.returns / batch.token_rewards)."""
        raise NotImplementedError

    # Where the KL to the reference goes: "loss" (a loss term, GRPO-style) or "reward"
    # (folded into token rewards before advantages, PPO/REINFORCE++-style).
    kl_placement: ClassVar[str] = "loss"

    def loss(self, logp: torch.Tensor, entropy: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        """Scalar loss to minimise for one micro-batch, plus float stats.

        The default is the shared policy-gradient objective: clipped surrogate
        (ops.clipped_surrogate, with ``clip_low``/``clip_high`` and optional ``dual_clip``),
        plus ``kl_coef`` x KL to the reference when ``kl_placement == "loss"``, minus
        ``entropy_coef`` x entropy, each aggregated with ``loss_agg`` using the
        minibatch's totals so micro-batch gradients sum to the minibatch gradient.
        ``mb.pg_weight`` (if set) multiplies the policy-gradient term per token.
        Stats are token means over the micro-batch (the engine averages them).
        """
        cfg, b = self.cfg, mb.batch
        dev = logp.device
        mask = b.response_mask.to(dev)

        def agg(mat: torch.Tensor) -> torch.Tensor:
            return ops.aggregate(
                mat, mask, cfg.loss_agg, num_tokens=mb.minibatch_tokens, num_seqs=mb.minibatch_seqs,
                max_len=mb.max_response_tokens,
            )

        pg_mat, pg_stats = self.policy_loss(logp, mb)
        if mb.pg_weight is not None:  # rollout/trainer mismatch correction (rollout.tis_cap)
            pg_mat = pg_mat * mb.pg_weight.to(dev, pg_mat.dtype)
        total = agg(pg_mat)
        stats = {
            "loss/policy": float(ops.masked_mean(pg_mat.detach(), mask)),
            "policy/clipfrac": pg_stats["clipfrac"],
            "policy/approx_kl": pg_stats["approx_kl"],
        }
        if cfg.kl_coef > 0 and self.kl_placement == "loss":
            kl_mat = ops.kl_penalty(logp, b.ref_logp.to(dev), cfg.kl_kind)
            total = total + cfg.kl_coef * agg(kl_mat)
            stats["loss/kl"] = float(ops.masked_mean(kl_mat.detach(), mask))
        if cfg.entropy_coef:
            total = total - cfg.entropy_coef * agg(entropy)
        return total, stats

    def policy_loss(self, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        """Per-token policy-gradient loss [b, T] and its stats (clipfrac, approx_kl).

        The PPO clipped surrogate (clip_low/clip_high, optional ``dual_clip``); GSPO,
        CISPO and other variants override only this.
        """
        b, dev = mb.batch, logp.device
        return ops.clipped_surrogate(
            logp, b.old_logp.to(dev), b.advantages.to(dev), b.response_mask.to(dev), self.cfg.clip_low,
            self.cfg.clip_high, dual_clip=getattr(self.cfg, "dual_clip", None), return_stats=True,
        )

    def update_aux(self, batch: Batch, engine: Any) -> dict[str, float]:
        """Train auxiliary models (critic, PRM) after the policy update. No-op here."""
        return {}
