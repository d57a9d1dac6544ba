"""Rollout backends: the protocol every engine speaks, the ``Generation`` it returns, and the registry.

A backend turns prompts into sampled responses and takes the trainer's weights after each update.
Built-ins: ``hf`` (transformers generate, the CPU default), ``vllm`` (a colocated vLLM engine) and
``remote`` (a ``harness serve`` process; chosen by ``rollout.server.url``). A user's backend registers the
same way from their own package (``plugins=[pkg.module]``)::

    from harness.runtime.rollout import BackendSpec, register_backend

    @register_backend("mine", summary="what it is")
    def build(ctx):                  # ctx: RolloutContext, the run's facts a backend is built from
        return MyEngine(ctx.model_path, ctx.tokenizer)

and runs with ``rollout.backend=mine``. ``Generation`` and the helpers below fix the conventions
every backend returns: prompts left-padded, responses right-padded with ``pad_id``,
``response_mask`` True up to and including the first EOS, ``n`` samples per prompt grouped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from harness.core.registry import Registry
from harness.runtime.settings import DriverSettings, RolloutConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# The modules that register the built-in backends (imported on the first lookup).
BUILTIN_MODULES = ("harness.runtime.rollout.hf", "harness.runtime.rollout.vllm", "harness.runtime.rollout.remote")
REMOTE = "remote"  # the backend a run gets when rollout.server.url is set, whatever rollout.backend names


@dataclass
class Generation:
    """Token-level output of one generate call (n samples per prompt, grouped)."""

    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P] bool
    response_ids: torch.Tensor  # [B, T] right-padded with pad_id
    response_mask: torch.Tensor  # [B, T] bool, True up to and including the first EOS
    truncated: torch.Tensor  # [B] bool, no EOS within the token budget
    group_ids: torch.Tensor  # [B] index of the source prompt
    rollout_logp: torch.Tensor | None = None  # [B, T] the rollout engine's log-prob of each token (0 on padding); None if not reported
    token_version: torch.Tensor | None = None  # [B, T] long: the policy version that sampled each token (-1 on padding); partial rollouts only
    # [B, T] int: the size of the sampler's kept set at each token under top-p / top-k (its highest-scoring tokens; 0 on
    # padding and where nothing was cut): what the trainer masks its logits to (rollout.mask_replay); None if not recorded
    rollout_kept: torch.Tensor | None = None


def request_seeds(n_prompts: int, n: int, generator: torch.Generator | None = None) -> list[int]:
    """One seed per prompt from ``generator`` (default: torch's global RNG): request i is seeded
    base + i*n (its sample j: + j)."""
    base = int(torch.randint(0, 2**31 - 1 - n_prompts * n, (1,), generator=generator))
    return [base + i * n for i in range(n_prompts)]


def encode_prompts(tokenizer, prompts: list[str] | list[list[int]], max_prompt_tokens: int | None = None):
    """Left-padded prompt ids and mask. ``prompts``: texts, or token ids as they are (an episode's
    context: re-tokenizing its text could split it differently from what was generated)."""
    if prompts and not isinstance(prompts[0], str):
        width = max(1, max(len(p) for p in prompts))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.bool)
        for i, p in enumerate(prompts):
            if p:
                ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p) :] = True
        return ids, mask
    enc = tokenizer(
        prompts,
        return_tensors="pt",
        padding=True,
        padding_side="left",
        add_special_tokens=False,
        truncation=max_prompt_tokens is not None,
        max_length=max_prompt_tokens,
    )
    return enc["input_ids"], enc["attention_mask"].bool()


def response_mask_from_ids(response_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of tokens up to and including the first EOS, and whether no EOS appeared."""
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, dtype=response_ids.dtype))
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()  # EOS tokens strictly before t
    mask = eos_before == 0
    truncated = ~is_eos.any(-1)
    return mask, truncated


def grouped_generation(
    prompt_ids, prompt_mask, response_ids, response_mask, truncated, n: int, pad_id: int, rollout_logp=None,
    rollout_kept=None,
) -> Generation:
    """The backend-independent output: prompts repeated n times, padding set to pad_id (logp 0)."""
    return Generation(
        prompt_ids=prompt_ids.repeat_interleave(n, 0),
        prompt_mask=prompt_mask.repeat_interleave(n, 0),
        response_ids=response_ids.masked_fill(~response_mask, pad_id),
        response_mask=response_mask,
        truncated=truncated,
        group_ids=torch.arange(prompt_ids.shape[0]).repeat_interleave(n),
        rollout_logp=None if rollout_logp is None else rollout_logp.masked_fill(~response_mask, 0.0),
        rollout_kept=None if rollout_kept is None else rollout_kept.masked_fill(~response_mask, 0),
    )


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    rows = [ids[m].tolist() for ids, m in zip(response_ids, response_mask)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


@runtime_checkable
class RolloutBackend(Protocol):
    """What the workers, the driver and ``harness serve`` call on a rollout engine.

    Optional, used when present: ``sleep()`` (free device memory while the trainer runs; called only for a
    backend registered with ``frees_memory=True``), ``close()``, ``verify_sync`` / ``sent_fingerprints`` / ``weight_fingerprints()`` (rollout.verify_sync, rollout/fingerprint.py),
    ``dtype`` (the engine's: weights are cast to it on the trainer's device before a sync) and
    ``return_logp`` (report ``Generation.rollout_logp``).
    """

    pad_id: int
    eos_ids: list[int]

    def generate(self, prompts: list, n: int, max_new_tokens: int, temperature: float = 1.0, top_p: float = 1.0,
                 seeds: list[int] | None = None) -> Generation: ...  # fmt: skip

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...


@dataclass(frozen=True)
class RolloutContext:
    """What a backend is built from: the run's facts, assembled once (``workers.worker.rollout_context``)."""

    model_path: str  # local directory of the starting weights
    tokenizer: PreTrainedTokenizerBase  # the trainer's tokenizer (prompts are tokenized the same way everywhere)
    device: str  # cpu | cuda
    model_dtype: str  # model.dtype
    trust_remote_code: bool
    max_prompt_tokens: int  # task.max_prompt_tokens: longer prompts are truncated
    share_prompts: bool  # trainer.share_prompts: prefill each distinct prompt once
    autocast_bf16: bool  # the trainer computes in bf16 (generate under bf16 autocast where the backend can)
    return_logp: bool  # report the sampled tokens' log-probs (pipelined runs: the behaviour policy)
    seed: int  # the run's seed (an engine's own seed)
    settings: RolloutConfig  # rollout.*: the sampling settings, and each built-in backend's own (vllm, server)


@dataclass
class BackendMemory:
    """A backend's terms in ``harness plan``, in bytes."""

    worker: dict[str, float] = field(default_factory=dict)  # in each training worker's process
    engine: dict[str, float] = field(default_factory=dict)  # in an engine process of its own
    sleeps: bool = False  # the engine frees its device memory while the trainer runs
    sync_weight_bytes: int = 4  # bytes per element of a weight-sync tensor, cast to the engine's dtype before it leaves


@dataclass(frozen=True)
class MemoryFacts:
    """What ``harness plan`` knows when it asks a backend for its memory."""

    params: int  # model parameters
    weight_bytes: int  # bytes per parameter at model.dtype
    checkpoint_bytes: float  # the starting checkpoint's size on disk
    device: str  # runtime.device
    device_gib: float | None  # the device's memory, when given
    pipelined: bool  # the rollout runs beside the update
    settings: RolloutConfig


@dataclass(frozen=True)
class BackendSpec:
    """A registered rollout backend."""

    name: str
    build: Callable[[RolloutContext], RolloutBackend]
    summary: str  # one line for `harness list`
    memory: Callable[[MemoryFacts], BackendMemory] | None = None  # its terms in `harness plan` (None: nothing counted)
    check: Callable[[DriverSettings], None] | None = None  # a run's checks (raise ConfigError), before any model is built
    # the engine's own values (raise ConfigError), wherever this engine is built: a run's, or `harness serve`'s
    check_engine: Callable[[RolloutConfig], None] | None = None
    owns: tuple[str, ...] = ()  # rollout.* fields only this engine reads: refused at another's default-differing value
    window: Callable[[RolloutConfig], int] | None = None  # the engine's own context window in tokens (0: the model's)
    frees_memory: bool = False  # has sleep(): the driver lets it free device memory while the trainer runs
    reports_logp: bool = False  # always reports its own sampled log-probs (the tokens' behaviour under its numerics)
    colocated: bool = True  # runs in the training worker's process (False: elsewhere, one client per run)


REGISTRY: Registry[BackendSpec] = Registry(
    "rollout backend", builtin_modules=BUILTIN_MODULES, entry_point_group="harness.backends", setting="rollout.backend",
    how_to_add="Register your own with @register_backend and load it with plugins=[your.module]",
    owner=lambda spec: spec.build,
)


def named_tensors(weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    """``load_weights``' argument as (name, tensor) pairs: a dict, or, for a backend whose class sets
    ``streams_weights = True``, an iterator whose tensors are gathered as they are drawn (draw each once,
    all of them: the ranks gather together)."""
    return weights.items() if isinstance(weights, Mapping) else weights


def register_backend(name: str, *, summary: str, memory: Callable[[MemoryFacts], BackendMemory] | None = None,
                     check: Callable[[DriverSettings], None] | None = None,
                     check_engine: Callable[[RolloutConfig], None] | None = None, owns: tuple[str, ...] = (),
                     window: Callable[[RolloutConfig], int] | None = None, frees_memory: bool = False,
                     reports_logp: bool = False, colocated: bool = True):  # fmt: skip
    """Decorator: register ``build(ctx) -> RolloutBackend`` as backend ``name`` (``rollout.backend=name``)."""

    def wrap(build: Callable[[RolloutContext], RolloutBackend]):
        REGISTRY.add(name, BackendSpec(name, build, summary, memory, check, check_engine, tuple(owns), window, frees_memory,
                                       reports_logp, colocated))
        return build

    return wrap


def registered_backends() -> dict[str, BackendSpec]:
    """Every registered backend (the built-ins, entry points ``harness.backends`` and imported plugins), by name."""
    return REGISTRY.entries()


def backend_name(settings: RolloutConfig) -> str:
    """The backend a run's rollout settings select: ``remote`` when ``rollout.server.url`` is set, else ``rollout.backend``."""
    return REMOTE if settings.server.url else settings.backend


def get_backend(name: str) -> BackendSpec:
    return REGISTRY.get(name)


def build_backend(ctx: RolloutContext) -> RolloutBackend:
    """The backend ``ctx.settings`` selects, built on ``ctx.device``."""
    return get_backend(backend_name(ctx.settings)).build(ctx)

