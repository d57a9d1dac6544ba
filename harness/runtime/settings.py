"""The runtime's settings: small frozen dataclasses, one per part, each part taking only its own.

``harness.config.runtime_settings`` assembles them once from the run's config; the driver
(``HybridEngine``) gets ``DriverSettings``, every worker its ``WorkerSettings`` (pickled to worker
processes and Ray actors), a rollout backend ``RolloutSettings``. Nothing below the config layer
reads the config itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class BatchSizes:
    """Derived batch sizes, computed once by ``harness.config.validate`` and logged."""

    sequences_per_step: int
    sequences_per_minibatch: int
    minibatches_per_epoch: int
    micro_batches_per_minibatch: int
    optimizer_steps_per_rl_step: int


@dataclass(frozen=True)
class LoraSettings:
    """``model.lora``: low-rank adapters instead of full fine-tuning (rank 0 = off)."""

    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]
    roles: tuple[str, ...]  # trainable declared roles that get adapters too


@dataclass(frozen=True)
class ModelSettings:
    path: str  # model.path as given: 'tiny', a directory, or a hub id (a worker on another node fetches it)
    dtype: str  # float32 | bfloat16
    trust_remote_code: bool
    lora: LoraSettings


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW and its schedule (the policy's; a role's learning rate replaces ``lr``)."""

    lr: float
    weight_decay: float
    betas: tuple[float, float]
    grad_clip: float  # max global grad norm (0 = off)
    warmup_steps: int  # linear warm-up, in optimizer steps

    def with_lr(self, lr: float) -> OptimizerSettings:
        return replace(self, lr=lr)


@dataclass(frozen=True)
class TrainSettings:
    """How a worker trains: precision, micro-batch layout, sharding."""

    precision: str  # fp32 | bf16 (autocast)
    share_prompts: bool  # each distinct prompt's KV cache serves all its samples
    pack_sequences: bool  # micro-batches as one unpadded packed row
    gradient_checkpointing: bool
    fsdp_shard_size: int  # workers per shard group; 0 = all (FSDP)
    micro_batch_sequences: int
    micro_batch_tokens: int  # > 0: micro-batches by tokens
    optimizer: OptimizerSettings


@dataclass(frozen=True)
class CorrectionSettings:
    """The loss's off-policy correction (``correction.*``): weights of the policy-gradient term from the
    importance ratios exp(old_logp - rollout_logp)."""

    name: str  # a registered correction (algorithms/corrections.py): none | tis | mask | icepop | seq_tis | ...
    cap: float  # the upper bound C
    low: float = 0.0  # the lower bound of the band corrections (mask, icepop, seq_mis, seq_mask, token_veto)
    exclude_rejected: bool = False  # rejected tokens off the response mask (denominator, KL, entropy)

    @property
    def on(self) -> bool:
        return self.name != "none"


@dataclass(frozen=True)
class VLLMSettings:
    """The vllm backend's own settings."""

    dtype: str
    gpu_memory_utilization: float
    tensor_parallel_size: int
    max_num_seqs: int
    max_model_len: int
    enable_sleep_mode: bool
    sleep_level: int
    enforce_eager: bool | None
    kv_cache_gib: float
    weight_bucket_mb: int
    weight_transport: str


@dataclass(frozen=True)
class ServerSettings:
    """A `harness serve` rollout server (the remote backend); ``url`` '' = none."""

    url: str
    retry_s: float
    connect_s: float
    timeout_s: float
    weights_dir: str
    token_file: str  # '' = $HARNESS_SERVE_TOKEN


@dataclass(frozen=True)
class RolloutSettings:
    """Generation: what every backend and the driver's rollout calls use."""

    backend: str  # the engine kind (rollout.backend; also the one behind a rollout server)
    temperature: float
    top_p: float
    top_k: int  # 0 = off
    mask_replay: bool  # the trainer masks the policy's logits to the rollout's kept set (Generation.rollout_kept)
    weight_quant: str  # none | int8 | fp8 | int4 | int3: the hf engine's decoder linears fake-quantized (rollout/quant.py)
    hf_dtype: str  # the hf engine's weights: auto (the trainer's) | bfloat16 | float32 (a mismatch dialled)
    max_response_tokens: int
    eval_max_response_tokens: int  # 0 = max_response_tokens
    eval_batch_prompts: int
    sample_seeds: bool | None
    verify_sync: bool
    verify_sync_stride: int  # fingerprint every Nth element of each tensor (1: all)
    max_prompt_tokens: int  # task.max_prompt_tokens: longer prompts are truncated
    use_chat_template: bool  # task.use_chat_template: how the driver renders prompts
    vllm: VLLMSettings
    server: ServerSettings


@dataclass(frozen=True)
class GroupSettings:
    """Where the workers live (``runtime.*``)."""

    workers: int
    launcher: str  # local | ray
    ray_address: str
    device: str  # auto | cpu | cuda
    threads: int  # torch threads per worker; 0 = the cores this process may use, shared out


@dataclass(frozen=True)
class EnvSettings:
    """Multi-turn episodes (``env.*``); name '' = one prompt, one response."""

    name: str
    max_turns: int
    max_turn_tokens: int


@dataclass(frozen=True)
class PipelineSettings:
    mode: str  # trainer.pipeline: sync | one_step_off | async
    max_staleness: int
    partial: str = "off"  # rollout.partial: off | continue | restart (async only)
    partial_chunk_tokens: int = 64  # rollout.partial_chunk_tokens: tokens per segment


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a ``Worker`` is built from."""

    seed: int
    model: ModelSettings
    train: TrainSettings
    rollout: RolloutSettings
    correction: CorrectionSettings
    device: str
    plugins: tuple[str, ...]  # modules the worker imports (a plugin's rollout backend)
    return_logp: bool  # the rollout reports its sampled log-probs (pipelined runs)


@dataclass(frozen=True)
class DriverSettings:
    """Everything the driver (``HybridEngine``) is built from."""

    seed: int
    model: ModelSettings
    train: TrainSettings
    rollout: RolloutSettings
    correction: CorrectionSettings
    group: GroupSettings
    env: EnvSettings
    pipeline: PipelineSettings
    plugins: tuple[str, ...]

    def worker(self, return_logp: bool) -> WorkerSettings:
        return WorkerSettings(seed=self.seed, model=self.model, train=self.train, rollout=self.rollout,
                              correction=self.correction, device=self.group.device, plugins=self.plugins,
                              return_logp=return_logp)  # fmt: skip
