"""The algorithm protocol, the batch that flows through the loop, and the base config.

An algorithm only does tensor math on a ``Batch`` and declares, as data, the models it
needs beside the policy (``Role``: a name, the weights it starts from, a head, trainable
or frozen, learning rate, loss); the runtime (harness/runtime) builds, shards, runs,
trains and checkpoints whatever is declared, by role name, and owns devices and
generation. Extra generation (a baseline response, refills) goes through the ``Sampler``
the loop hands to ``select``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Protocol

import torch

from algorithms import ops, parts
from algorithms.parts import param, register_advantage, register_loss

LossFn = Callable[[torch.Tensor, Any, "MicroBatch"], tuple[torch.Tensor, dict]]


@dataclass(frozen=True)
class Role:
    """A model an algorithm needs beside the policy. The engine builds it on every worker,
    runs it on each batch before ``advantages`` (its per-token outputs land in
    ``batch.outputs[name]``), trains it after the policy when ``trainable`` (``loss``,
    ``epochs`` passes), and checkpoints it under ``name``.
    """

    name: str  # key in batch.outputs and in checkpoints; "policy" is the engine's own
    init: str = "policy"  # starting weights: "policy" (the run's starting model) or an HF id / directory
    head: str = "lm"  # "lm": per-token log-probs of the response | "scalar": one value per token (zero-init head)
    trainable: bool = False
    lr: float | None = None  # None: lr_scale x trainer.lr
    lr_scale: float = 1.0
    loss: LossFn | None = None  # (outputs [b, T], None, MicroBatch) -> (loss, stats); required when trainable
    epochs: int = 1  # passes over the batch per update

    def __post_init__(self):
        if self.name == "policy":
            raise ValueError("role name 'policy' is the engine's own model; name the extra model otherwise")
        if self.head not in ("lm", "scalar"):
            raise ValueError(f"Role({self.name!r}).head={self.head!r}: choose 'lm' or 'scalar'")
        if self.trainable and self.loss is None:
            raise ValueError(f"Role({self.name!r}) is trainable but has no loss")


REFERENCE = Role("reference")  # frozen copy of the initial policy: batch.ref_logp


@dataclass(frozen=True)
class Needs:
    """What an algorithm asks of the engine beyond sampling and training the policy."""

    roles: tuple[Role, ...] = ()  # extra models, built and run in this order
    old_logp: bool = True  # log-probs of the behaviour policy before the update
    # True when ``advantages`` reads old_logp/ref_logp (e.g. KL folded into the reward):
    # the engine then computes them before advantages even for on-policy updates.
    logp_before_advantages: bool = False

    def __post_init__(self):
        names = [r.name for r in self.roles]
        if len(set(names)) != len(names):
            raise ValueError(f"Needs.roles names a model twice: {names}")

    def has(self, role_name: str) -> bool:
        return any(r.name == role_name for r in self.roles)


class Sampler(Protocol):
    """Extra generation for ``Algorithm.select``; every token it generates counts in the budget."""

    def more(self) -> Batch:
        """Scored responses to ``prompts_per_step`` fresh prompts, ``samples_per_prompt`` each."""

    def generate(self, prompts: list[str], ground_truths: list[str], n: int, temperature: float) -> Batch:
        """``n`` scored responses to each rendered prompt (temperature 0: the argmax response), under
        the training length cap."""


@dataclass
class Batch:
    """One step's rollouts. Token tensors cover the *response* tokens only: [B, T].

    B = prompts_per_step * samples_per_prompt sequences; samples of one prompt share a
    ``group_ids`` value. Prompts are left-padded, responses right-padded.
    """

    prompt_ids: torch.Tensor  # [B, P] long, left-padded
    prompt_mask: torch.Tensor  # [B, P] bool
    response_ids: torch.Tensor  # [B, T] long, right-padded
    response_mask: torch.Tensor  # [B, T] bool: the model's tokens (incl. EOS): what losses, KL and entropy see
    group_ids: torch.Tensor  # [B] long: index of the prompt within the step
    prompts: list[str]  # [B] rendered prompt text
    responses: list[str]  # [B] decoded response text (special tokens removed)
    ground_truths: list[str]  # [B]
    truncated: torch.Tensor  # [B] bool: hit max_response_tokens without EOS
    max_response_tokens: int = 0  # the length cap the responses were generated under
    rollout_logp: torch.Tensor | None = None  # [B, T] the rollout engine's own log-probs (vllm)
    rollout_kept: torch.Tensor | None = None  # [B, T] int: its kept set's size at each token (top-p / top-k; 0 = all)
    token_version: torch.Tensor | None = None  # [B, T] long: the policy version that sampled each token (partial rollouts)
    scores: torch.Tensor | None = None  # [B] float: checker reward
    correct: torch.Tensor | None = None  # [B] bool: checker verdict
    filler: torch.Tensor | None = None  # [B] bool: rows kept only to fill the batch (see sampling.refill_groups)
    old_logp: torch.Tensor | None = None  # [B, T] behaviour-policy log-probs
    # Per-row tensors by name: each declared Role's per-token outputs [B, T] under the role's
    # name (filled by the engine), plus any an algorithm attaches in ``select``.
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    token_rewards: torch.Tensor | None = None  # [B, T] if the algorithm shapes per-token rewards
    advantages: torch.Tensor | None = None  # [B, T]
    returns: torch.Tensor | None = None  # [B, T]
    # Multi-turn episodes (harness/runtime/driver/episodes.py): the response span holds the model's turns
    # and the environment's observations. ``context_mask`` [B, T] bool marks every real token of it
    # (attention and positions); ``response_mask`` only the model's. None = no environment tokens.
    context_mask: torch.Tensor | None = None
    episode: dict[str, Any] | None = None  # per-row turns, tool_calls, tool_errors [B] and end reasons (list)

    @property
    def attention_mask(self) -> torch.Tensor:
        """[B, T] bool: the response-span tokens the model reads (its own and the environment's)."""
        return self.response_mask if self.context_mask is None else self.context_mask

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def ref_logp(self) -> torch.Tensor | None:
        """[B, T] log-probs of the frozen reference (the ``REFERENCE`` role's outputs)."""
        return self.outputs.get(REFERENCE.name)

    @ref_logp.setter
    def ref_logp(self, value: torch.Tensor) -> None:
        self.outputs[REFERENCE.name] = value

    def kept(self) -> torch.Tensor:
        """[B] bool: rows that are not filler."""
        return torch.ones(len(self), dtype=torch.bool) if self.filler is None else ~self.filler

    def select(self, index: torch.Tensor) -> Batch:
        """Rows ``index`` of every per-sequence field (tensors, lists and ``outputs``)."""
        idx = index.tolist()
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = _take(value, index, idx)
        return replace(self, **out)

    @staticmethod
    def concat(batches: list[Batch]) -> Batch:
        """Row-wise concatenation; token tensors are right/left padded to a common width.

        Every batch must carry the same ``outputs`` names; ``filler`` missing on some counts as
        False there; ``max_response_tokens`` is the largest."""
        first = batches[0]
        names = [sorted(b.outputs) for b in batches]
        if any(n != names[0] for n in names):
            raise ValueError(f"Batch.concat: batches carry different outputs {names}; attach outputs after refills")
        out = {}
        for f in fields(first):
            values = [getattr(b, f.name) for b in batches]
            if f.name == "filler" and any(v is not None for v in values):
                values = [torch.zeros(len(b), dtype=torch.bool) if v is None else v for b, v in zip(batches, values)]
            elif f.name == "context_mask" and any(v is not None for v in values):  # None: no environment tokens
                values = [b.response_mask if v is None else v for b, v in zip(batches, values)]
            elif f.name == "max_response_tokens":
                values = [max(values)]
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


def _cat(name: str, values: list[Any], left: bool | None = None) -> Any:
    if values[0] is None:
        return None
    if isinstance(values[0], list):
        return [x for v in values for x in v]
    if isinstance(values[0], dict):  # outputs: per-row tensors, right-padded
        return {k: _cat(k, [v[k] for v in values], left=False) for k in values[0]}
    if isinstance(values[0], torch.Tensor):
        if values[0].dim() == 2:
            width = max(v.shape[1] for v in values)
            left = name.startswith("prompt") if left is None else left  # prompts are left-padded, the rest right
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
    # > 0: the policy gradient flows only through the top fraction of each micro-batch's tokens by entropy
    # (the "forking" tokens of arXiv:2506.01939, which keeps 0.2); 0 = every token. Any algorithm.
    entropy_token_frac: float = 0.0
    # A registered part in place of the algorithm's own (algorithms/parts.py; '' = its own): e.g. grpo's
    # loss with RLOO's advantage, advantage=rloo. `harness list` shows the parts.
    advantage: str = ""
    loss: str = ""
    # Hooks around the advantage ('' or 'none' = none; an algorithm's defaults are its paper's, e.g. DAPO's):
    # reward shaping of the scores the advantage reads (shaping=overlong), and a sampling filter on the groups a step
    # trains on (filter=dynamic | accuracy).
    shaping: str = ""
    filter: str = ""


class Algorithm:
    """Base class; registered subclasses override what differs from the paper baseline."""

    config_class: ClassVar[type[AlgoConfig]] = AlgoConfig
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    # Descriptive metadata for docs/algorithms.md (generated, never hand-copied).
    metadata: ClassVar[dict[str, str]] = {}
    # True when the algorithm learns from ``batch.correct`` (the checker's right/wrong verdict), not
    # only from ``batch.scores``: it then cannot run with a reward model as the only training signal.
    learns_from_verdicts: ClassVar[bool] = False

    def __init__(self, cfg: AlgoConfig):
        self.cfg = cfg
        parts.compose(self)  # algo.advantage / algo.loss: a registered part replaces the method

    @property
    def learns_from_reward(self) -> bool:
        """Whether the training reward drives the update (the run warns when its first steps' rewards
        give no signal). On-policy distillation learns from its teacher instead."""
        return True

    @property
    def samples_per_prompt(self) -> int:
        return self.cfg.samples_per_prompt

    @property
    def needs(self) -> Needs:
        """A reference when there is a KL term; with the KL in the reward, advantages read
        old/ref log-probs, so the engine must compute them before ``advantages``."""
        kl = self.cfg.kl_coef > 0
        return Needs(roles=(REFERENCE,) if kl else (), logp_before_advantages=kl and self.kl_placement == "reward")

    def kl_in_reward(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """[B, T] the per-token KL (``kl_kind``) of the behaviour policy against the reference, which the
        algorithms with ``kl_placement = "reward"`` subtract from their rewards (x kl_coef, per token or summed
        per response), and its mean per response token as the ``reward/kl`` metric."""
        kl = ops.reward_kl(batch.old_logp, batch.ref_logp, batch.response_mask, self.cfg.kl_kind)
        return kl, {"reward/kl": float(ops.masked_mean(kl, batch.response_mask))}

    def trains_policy(self, step: int) -> bool:
        """Whether RL step ``step`` (1, 2, ...) updates the policy; False leaves it as it is while the declared
        trainable roles still train (PPO's critic warm-up). The step's tokens count in the budget all the same."""
        return True

    def select(self, batch: Batch, sampler: Sampler) -> tuple[Batch, dict[str, float]]:
        """Filter, regenerate or extend the scored rollouts; returns the batch and metrics.

        Identity here. DAPO and PRIME drop groups and call ``sampler.more()`` for fresh
        ones; ReMax generates a baseline response with ``sampler.generate`` and attaches
        its score to ``batch.outputs``.
        """
        return batch, {}

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:  # pragma: no cover - abstract
        """[B, T] advantages and metrics (may also set batch.returns / batch.token_rewards)."""
        raise NotImplementedError

    def describe(self) -> dict[str, str]:
        """The knobs that change results, as shown beside each row of a report (run.json); a composition
        (algo.advantage / algo.loss) adds its parts and its name, e.g. 'grpo [advantage=rloo, loss=gspo]'."""
        advantage, loss = parts.chosen(self.cfg)
        swapped = {"composition": parts.label(self.cfg)} if parts.label(self.cfg) else {}
        # the swapped-in advantage replaces the host's baseline and normalisation in the report's columns
        swapped |= {"advantage": advantage, "baseline": f"advantage={advantage}",
                    "normalisation": f"advantage={advantage}"} if advantage else {}
        swapped |= {"loss": loss} if loss else {}
        return {**self.metadata, "kl_placement": self.kl_placement, **swapped}

    # policy_loss stats logged besides clipfrac and approx_kl (as policy/<name>), e.g. Clip-Cov's covfrac.
    extra_stats: ClassVar[tuple[str, ...]] = ()

    # Where the KL to the reference goes: "loss" (a loss term, GRPO-style) or "reward"
    # (folded into token rewards before advantages, PPO/REINFORCE++-style).
    kl_placement: ClassVar[str] = "loss"

    @property
    def entropy_grad(self) -> bool:
        """Whether ``loss`` needs the entropy's gradient: ``cfg.entropy_coef`` is non-zero, or the
        algorithm overrides ``loss`` (its use of the entropy is its own). Otherwise the engine
        computes the entropy as a metric only, without autograd (it saves several
        [micro-batch, response, vocabulary] tensors). Override to state it outright."""
        return bool(getattr(self.cfg, "entropy_coef", 0.0)) or type(self).loss is not Algorithm.loss

    def loss(self, logp: torch.Tensor, entropy: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
        """Scalar loss to minimise for one micro-batch, plus float stats.

        The default is the shared policy-gradient objective: clipped surrogate
        (ops.clipped_surrogate, with ``clip_low``/``clip_high`` and optional ``dual_clip``),
        plus ``kl_coef`` x KL to the reference when ``kl_placement == "loss"``, minus
        ``entropy_coef`` x entropy (with ``entropy_token_frac`` > 0 the policy-gradient term
        only at the micro-batch's highest-entropy tokens), each aggregated with ``loss_agg`` using the
        minibatch's totals so micro-batch gradients sum to the minibatch gradient.
        ``mb.pg_weight`` (if set) multiplies the policy-gradient term per token. ``entropy``
        carries its gradient when ``entropy_grad`` says so.
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
        if mb.pg_weight is not None:  # rollout/trainer mismatch correction (correction.name)
            pg_mat = pg_mat * mb.pg_weight.to(dev, pg_mat.dtype)
        kept = None
        if cfg.entropy_token_frac > 0:  # only the high-entropy tokens learn; the denominators stay all tokens
            kept = ops.high_entropy_mask(entropy.detach(), mask, cfg.entropy_token_frac)
            pg_mat = pg_mat * kept.to(pg_mat.dtype)
        total = agg(pg_mat)
        stats = {
            "loss/policy": float(ops.masked_mean(pg_mat.detach(), mask)),
            "policy/clipfrac": pg_stats["clipfrac"],
            "policy/approx_kl": pg_stats["approx_kl"],
            **{f"policy/{k}": v for k, v in pg_stats.items() if k not in ("clipfrac", "approx_kl")
               and k in self.extra_stats},
        }
        if kept is not None:
            stats["policy/entropy_token_frac"] = float(ops.masked_mean(kept.to(pg_mat.dtype), mask))
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
        return ppo_clip_loss(self, logp, mb)



class GroupAdvantage(Algorithm):
    """Base for the GRPO family: the group-normalised outcome advantage (ops.group_normalized_advantage,
    ``cfg.eps`` added to the group std; divided by it unless a config sets ``scale_by_std: false``) at every
    response token; subclasses change only the loss."""

    def advantages(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        return group_advantage(self, batch)


@register_loss("ppo_clip", "PPO's clipped surrogate, ratio clipped to [1 - clip_low, 1 + clip_high], optional dual "
               "clip (1707.06347)", clip_low=0.2, clip_high=0.2, dual_clip=None)  # fmt: skip
def ppo_clip_loss(algo: Algorithm, logp: torch.Tensor, mb: MicroBatch) -> tuple[torch.Tensor, dict]:
    b, dev = mb.batch, logp.device
    return ops.clipped_surrogate(
        logp, b.old_logp.to(dev), b.advantages.to(dev), b.response_mask.to(dev), param(algo, "ppo_clip", "clip_low"),
        param(algo, "ppo_clip", "clip_high"), dual_clip=param(algo, "ppo_clip", "dual_clip"), return_stats=True,
    )


@register_advantage("group", "group mean, divided by the group std unless scale_by_std=false (GRPO, 2402.03300)",
                    needs_group=True, eps=1e-6, scale_by_std=True)  # fmt: skip
def group_advantage(algo: Algorithm, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    adv = ops.group_normalized_advantage(batch.scores, batch.group_ids, eps=param(algo, "group", "eps"),
                                         scale_by_std=param(algo, "group", "scale_by_std"))  # fmt: skip
    return adv[:, None] * batch.response_mask, {}


@register_advantage("group_mean", "group mean only, no std division (Dr. GRPO, 2503.20783)", needs_group=True)
def group_mean_advantage(algo: Algorithm, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    adv = ops.group_normalized_advantage(batch.scores, batch.group_ids, scale_by_std=False)
    return adv[:, None] * batch.response_mask, {}
