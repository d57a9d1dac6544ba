"""Structured (dataclass) configs, registered in Hydra's ConfigStore.

Groups: ``algo`` (one node per registered algorithm, see algorithms/), ``task``,
``model``, ``rollout``, ``trainer``, ``runtime``. Every field has a one-line doc; batch
sizes carry their unit in the name. ``validate`` checks derived sizes before any model
is built, so a bad override fails in a second, not after the warm start.
"""

from __future__ import annotations

import difflib
import hashlib
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

import algorithms
from harness.core.errors import ConfigError as ConfigError  # re-exported for the layers above
from harness.data.tasks import registered_tasks
from harness.rundir.schema import RENAMED_KEYS
from harness.rundir.schema import budget_spec as budget_spec
from harness.runtime.settings import (
    BatchSizes,
    CorrectionSettings,
    DriverSettings,
    EnvSettings,
    GroupSettings,
    LoraSettings,
    ModelSettings,
    OptimizerSettings,
    PipelineSettings,
    RolloutSettings,
    ServerSettings,
    TrainSettings,
    VLLMSettings,
)


@dataclass
class TinyModelConfig:
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
class LoraConfig:
    """Low-rank adapters (peft) instead of full fine-tuning; the frozen base is the KL reference."""

    rank: int = 0  # adapter rank r; 0 = off (full fine-tuning)
    alpha: float = 16.0  # the update is (alpha / rank) * B A
    dropout: float = 0.0  # dropout on the adapters' input; > 0 also perturbs the policy's old log-prob pass (train mode)
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # linear layers that get adapters (Qwen2/Llama names)
    roles: list[str] = field(default_factory=list)  # trainable declared roles that get adapters too, e.g. [critic]; others train fully


@dataclass
class ModelConfig:
    path: str = "tiny"  # 'tiny' (built offline), a local directory, or a Hugging Face hub id
    dtype: str = "float32"  # parameter dtype of the trained model: float32 | bfloat16
    trust_remote_code: bool = False  # passed to from_pretrained
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class TaskConfig:
    name: str = "arith"  # a registered task: arith | arith_calc | reasoning | gsm8k | math | math500 | a plugin's (see `harness list`)
    checker: str = "arith"  # reward checker name (see `harness list`)
    source: str = ""  # data: a directory of train/test parquet or jsonl, or a hub id; '' = task default
    prompt_template: str = "{question}"  # how the question becomes the user message
    use_chat_template: bool = True  # render prompts with the tokenizer's chat template when it has one
    eval_prompts: int = 128  # held-out prompts scored greedily at each eval
    max_prompt_tokens: int = 256  # longer prompts are dropped at load time (logged)
    # arith only: a deterministic synthetic problem pool
    digits: int = 2  # max digits per operand
    operators: str = "+"  # operators drawn from, e.g. '+-*'
    terms: int = 2  # operands per problem
    train_size: int = 20000  # problems in the training pool
    data_seed: int = 1234  # seed of the problem pool (fixed across run seeds, so eval sets match)


@dataclass
class VLLMConfig:
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
class ServerConfig:
    """rollout.server: a `harness serve` rollout server (http://host:port) instead of an in-process engine;
    one run per server."""

    url: str = ""  # '' = an in-process engine
    retry_s: float = 300.0  # how long a run waits (retrying) for a server that stopped answering
    connect_s: float = 10.0  # how long the first contact may take before the run fails
    timeout_s: float = 600.0  # the longest one generate call may take
    weights_dir: str = ""  # weight updates through a file in this directory (the server's --weights-dir) instead of HTTP
    token_file: str = ""  # the server's shared token, read from this file; '' = $HARNESS_SERVE_TOKEN (if set)


@dataclass
class CorrectionConfig:
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


@dataclass
class RolloutConfig:
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
class TrainerConfig:
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
class RuntimeConfig:
    workers: int = 1  # data-parallel workers (FSDP2 world size), each with its own rollout engine; one per GPU on GPU
    launcher: str = "local"  # local (workers=1: in-process; more: spawned processes) | ray (one actor per worker)
    ray_address: str = ""  # launcher=ray: '' = start a local Ray; 'auto' or host:port = attach to that cluster
    device: str = "auto"  # auto | cpu | cuda
    threads: int = 0  # torch intra-op threads per worker; 0 = torch default (1 process) or cores / workers
    # Workers per FSDP shard group: 0 = all of them (FSDP); N = hybrid sharding (HSDP): parameters,
    # gradients and optimizer state sharded within groups of N workers (a node's GPUs, where
    # all-gathers are fast), replicated across groups (gradients all-reduced between nodes).
    fsdp_shard_size: int = 0


@dataclass
class LoggingConfig:
    # Where metrics go besides metrics.jsonl (always written): tensorboard | wandb | mlflow (the
    # trackers extra); each gets every metrics line, step = RL step (harness/rundir/sinks.py).
    sinks: list[str] = field(default_factory=lambda: ["jsonl"])
    wandb_project: str = "harness"
    wandb_entity: str = ""  # '' = your default entity
    mlflow_tracking_uri: str = ""  # '' = a file store in <run_dir>/mlruns
    # Log kl/from_start (KL(policy || start) per sequence, the sampled estimate) every step; an
    # algorithm without a reference model gets the frozen start as one (a forward pass more per step).
    kl_from_start: bool = False


@dataclass
class RewardModelConfig:
    # `harness rm train` (harness/reward_model.py): Bradley-Terry on preference pairs.
    train_pairs: str = "arith"  # 'arith' (built from the arith task's train split) or a jsonl/parquet file
    eval_pairs: str = "arith"  # held-out pairs: 'arith' (its test split) or a file
    steps: int = 1500
    pairs_per_step: int = 32
    lr: float = 3e-4  # peak; decays linearly to 0
    eval_every: int = 100


@dataclass
class RewardConfig:
    # The training reward (harness/scoring.py): the task's checker, a reward model, a weighted mix, or
    # random: a control that pays 1 with probability random_rate whatever the answer (the "random
    # reward" of Spurious Rewards, arXiv 2506.10947; the report marks its rows as controls).
    # The checker scores every rollout whatever the source (the gold reward: reward/gold_accuracy).
    source: str = "checker"  # checker | model | mix | random
    # source=model|mix: a `harness rm train` export (<rm run>/reward_model), or 'tiny': trained on
    # arith pairs from model.path with the rm.* settings, once per machine (cached like the tiny model)
    model_path: str = ""
    model_weight: float = 0.5  # source=mix: reward = model_weight * model + (1 - model_weight) * checker
    # source=random: P(reward 1); set it to the task's base rate (the start's sampled accuracy) so the
    # control's reward has the checker's mean and none of its information
    random_rate: float = 0.5


@dataclass
class TeacherConfig:
    """The tiny teacher: a model role whose weights are 'tiny' (an algorithm's role init, e.g. a teacher) is
    model.tiny's recipe (the same tokenizer, so it reads the student's tokens) with these changes,
    built offline once and cached like the tiny model. Needs model.path=tiny."""

    sft_steps: int = 2000  # exactly this many SFT steps (the student's warm start: the sizing rule, 200 on arith)
    hidden_size: int = 0  # 0 = model.tiny's
    num_layers: int = 0  # 0 = model.tiny's
    intermediate_size: int = 0  # 0 = model.tiny's


@dataclass
class EnvConfig:
    """Multi-turn episodes: the model and an environment take turns (docs/environments.md)."""

    name: str = ""  # a registered environment (calculator | a plugin's, see `harness list`); '' = one prompt, one response
    max_turns: int = 4  # model turns per episode
    # Tokens per model turn; 0 = what is left of rollout.max_response_tokens, which caps the whole
    # response span of an episode (the model's turns and the environment's observations).
    max_turn_tokens: int = 0
    demo_frac: float = 0.15  # model.path=tiny: fraction of warm-start examples taught as a worked episode (the rest answer directly)


@dataclass
class Config:
    defaults: list[Any] = field(
        default_factory=lambda: [
            "_self_",
            {"algo": algorithms.DEFAULT},
            {"task": "arith"},
            {"model": "tiny"},
            {"rollout": "hf"},
            {"trainer": "default"},
            {"runtime": "local"},
        ]
    )
    algo: Any = MISSING  # chosen with algo=NAME; fields per algorithm (see `harness list`)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    rm: RewardModelConfig = field(default_factory=RewardModelConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    seed: int = 0  # data order, sampling and init all derive from it
    run_dir: str = ""  # where results go; '' = Hydra's output dir (results/runs/<overrides>)
    plugins: list[str] = field(default_factory=list)  # modules to import: a user's algorithms and tasks
    samples: int = 1  # harness eval: responses per prompt (pass@k up to this k)
    eval_limit: int = 0  # harness eval: score only the first N test prompts (0 = all)


# reward.source values that score with a reward model (served on the workers; not a checker, not a coin)
REWARD_MODEL_SOURCES = ("model", "mix")

# The values an enumerated field accepts (validate checks them; `harness run --help` lists them).
CHOICES: dict[str, tuple[str, ...]] = {
    "logging.sinks": ("jsonl", "tensorboard", "wandb", "mlflow"),  # a list: any of these
    "trainer.pipeline": ("sync", "one_step_off", "async"),
    "trainer.budget": ("steps", "tokens", "wall_s"),
    "trainer.precision": ("fp32", "bf16"),
    "trainer.behaviour_logp": ("behaviour", "recompute"),
    "rollout.partial": ("off", "continue", "restart"),
    "rollout.hf_dtype": ("auto", "bfloat16", "float32"),
    "reward.source": ("checker", "model", "mix", "random"),
    "model.dtype": ("float32", "bfloat16"),
    "rollout.vllm.weight_transport": ("auto", "shm", "rpc"),
    "rollout.vllm.dtype": ("auto", "bfloat16", "float16", "half", "float32", "float"),  # vLLM's names
    "runtime.launcher": ("local", "ray"),
    "runtime.device": ("auto", "cpu", "cuda"),
}


def choices_help() -> str:
    """The help footer's list of enumerated fields and their values (registries: `harness list`)."""
    from algorithms.corrections import REGISTRY as corrections
    from harness.runtime.rollout.quant import KINDS as quant_kinds

    listed = {**CHOICES, "correction.name": tuple(corrections.names()),  # its registry's (plugins included)
              "rollout.weight_quant": quant_kinds}  # the dial's own list
    width = max(len(k) for k in listed)
    lines = [f"  {key:<{width}}  {' | '.join(values)}" for key, values in listed.items()]
    return "\n".join(["== Choices of enumerated fields ==", *lines,
                      "  algo, task, task.checker, env.name, rollout.backend: registries, listed by `harness list`"])


def task_presets() -> dict[str, TaskConfig]:
    """``task=NAME`` presets of every registered task (harness/data/tasks.py: checker, prompt format...)."""
    presets = {}
    for name, spec in registered_tasks().items():
        unknown = sorted(set(spec.preset) - {f.name for f in fields(TaskConfig)})
        if unknown:
            raise ConfigError(f"task {name!r} ({spec.load.__module__}): preset field(s) {unknown} are not TaskConfig "
                              f"fields; known: {', '.join(f.name for f in fields(TaskConfig))}")
        presets[name] = TaskConfig(**spec.preset)
    return presets


TASK_PRESETS: dict[str, TaskConfig] = task_presets()  # built-ins and entry points; task=NAME sees plugins too


def register_configs() -> None:
    """Store the primary config and the groups in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="harness_schema", node=Config)
    for name, preset in task_presets().items():
        cs.store(group="task", name=name, node=preset)
    cs.store(group="model", name="tiny", node=ModelConfig())
    from harness.runtime.rollout import registered_backends

    for name, spec in registered_backends().items():  # rollout=hf|vllm|a plugin's
        if spec.colocated:
            cs.store(group="rollout", name=name, node=RolloutConfig(backend=name))
    cs.store(group="trainer", name="default", node=TrainerConfig())
    cs.store(group="runtime", name="local", node=RuntimeConfig())
    cs.store(group="runtime", name="ray", node=RuntimeConfig(launcher="ray"))
    algorithms.REGISTRY.load()  # registers every built-in algo node in group 'algo'


def run_name(override_dirname: str) -> str:
    """Directory name for a run: its overrides, shortened with a hash when too long."""
    if not override_dirname:
        return "default"
    # a path value (model.path=/data/m) would nest directories: "/" becomes "_", and the hash
    # keeps /a_b and /a/b apart
    name = override_dirname.replace("/", "_")
    if len(name) <= 120 and name == override_dirname:
        return name
    digest = hashlib.sha1(override_dirname.encode()).hexdigest()[:10]
    return f"{name[:100]}...{digest}"


# Config fields the runtime never sees: the driver (harness/trainer.py), the commands and the
# checks read them. Every other field of Config reaches a settings object through
# runtime_settings (tests/harness/test_settings_mapping.py holds both lists to the config).
DRIVER_ONLY = (
    "model.tiny.*", "task.name", "task.checker", "task.source", "task.prompt_template", "task.eval_prompts",
    "task.digits", "task.operators", "task.terms", "task.train_size", "task.data_seed", "teacher.*", "logging.*", "rm.*", "reward.*",
    "trainer.steps", "trainer.budget", "trainer.budget_tokens", "trainer.budget_wall_s", "trainer.prompts_per_step",
    "trainer.sequences_per_minibatch", "trainer.eval_every", "trainer.eval_every_tokens", "trainer.checkpoint_every",
    "trainer.max_skipped_steps", "trainer.behaviour_logp", "env.demo_frac",
    "run_dir", "samples", "eval_limit",
)  # fmt: skip

# The settings fields whose config field has another name (settings class, field) -> config path;
# every other field is the config field of its own name in the group runtime_settings reads it from.
RENAMED_SETTINGS = {
    ("TrainSettings", "fsdp_shard_size"): "runtime.fsdp_shard_size",
    ("RolloutSettings", "max_prompt_tokens"): "task.max_prompt_tokens",
    ("RolloutSettings", "use_chat_template"): "task.use_chat_template",
    ("PipelineSettings", "mode"): "trainer.pipeline",
    ("PipelineSettings", "max_staleness"): "trainer.max_staleness",
    ("PipelineSettings", "partial"): "rollout.partial",
    ("PipelineSettings", "partial_chunk_tokens"): "rollout.partial_chunk_tokens",
}


def _setting(value: Any, hint: Any) -> Any:
    """A config value as the frozen settings hold it: lists become tuples, scalars the field's type (a
    config loaded from a run's config.yaml is untyped: ``lr: 1`` is an int there)."""
    if OmegaConf.is_config(value):
        return tuple(OmegaConf.to_container(value, resolve=True))
    if hint in (int, float, str, bool) and value is not None:
        return hint(value)
    return value


def _by_name(cls: type, cfg: Any, group: str, **parts: Any) -> Any:
    """``cls`` built by keyword: each field is ``parts[name]`` when given (a nested settings object),
    else the config field of that name in ``group`` (or at its RENAMED_SETTINGS path)."""
    hints, values = typing.get_type_hints(cls), {}
    for f in fields(cls):
        if f.name in parts:
            values[f.name] = parts[f.name]
            continue
        path = RENAMED_SETTINGS.get((cls.__name__, f.name), f"{group}.{f.name}")
        value = OmegaConf.select(cfg, path, throw_on_missing=True)
        if value is None and hints[f.name] in (int, float, str, bool):  # absent from a hand-written config.yaml
            raise ConfigError(f"{path} is missing from the config; set it (see `harness run --help`)")
        values[f.name] = _setting(value, hints[f.name])
    return cls(**values)


def runtime_settings(cfg: Config) -> DriverSettings:
    """The one assembly step: the config's groups -> the frozen settings each runtime part takes
    (harness/runtime/settings.py), every field by name. The runtime never reads the config itself."""
    rollout = _by_name(RolloutSettings, cfg, "rollout", vllm=_by_name(VLLMSettings, cfg, "rollout.vllm"),
                       server=_by_name(ServerSettings, cfg, "rollout.server"))  # fmt: skip
    return DriverSettings(
        seed=int(cfg.seed),
        model=_by_name(ModelSettings, cfg, "model", lora=_by_name(LoraSettings, cfg, "model.lora")),
        train=_by_name(TrainSettings, cfg, "trainer", optimizer=_by_name(OptimizerSettings, cfg, "trainer")),
        rollout=rollout,
        correction=_by_name(CorrectionSettings, cfg, "correction"),
        group=_by_name(GroupSettings, cfg, "runtime"),
        env=_by_name(EnvSettings, cfg, "env", name=str(cfg.env.name or "")),  # env.name=null: no environment
        pipeline=_by_name(PipelineSettings, cfg, "trainer"),
        plugins=_setting(cfg.plugins, None),
    )


def derive_batch_sizes(cfg: Config) -> BatchSizes:
    """Check divisibility of the batch sizes; raise ConfigError naming the fields."""
    t, samples = cfg.trainer, int(cfg.algo.samples_per_prompt)
    for name, value in [
        ("trainer.prompts_per_step", t.prompts_per_step),
        ("algo.samples_per_prompt", samples),
        ("trainer.micro_batch_sequences", t.micro_batch_sequences),
        ("algo.epochs", cfg.algo.epochs),
        ("trainer.steps", t.steps),
        ("runtime.workers", cfg.runtime.workers),
        ("rollout.verify_sync_stride", cfg.rollout.verify_sync_stride),
    ]:
        if int(value) < 1:
            raise ConfigError(f"{name}={value} must be >= 1")
    per_step = t.prompts_per_step * samples
    per_mb = t.sequences_per_minibatch or per_step
    if per_step % per_mb:
        raise ConfigError(
            f"trainer.prompts_per_step ({t.prompts_per_step}) x algo.samples_per_prompt ({samples}) = "
            f"{per_step} sequences per step is not divisible by trainer.sequences_per_minibatch ({per_mb}); "
            f"pick a divisor of {per_step}"
        )
    workers = int(cfg.runtime.workers)
    if per_mb % workers:
        raise ConfigError(
            f"trainer.sequences_per_minibatch ({per_mb}) is not divisible by runtime.workers ({workers}): each "
            f"worker trains an equal share of every minibatch; pick runtime.workers dividing {per_mb}, or "
            f"change trainer.prompts_per_step / trainer.sequences_per_minibatch"
        )
    share = per_mb // workers  # sequences per worker per optimizer step
    micro = min(t.micro_batch_sequences, share)
    if share % micro:
        raise ConfigError(
            f"trainer.sequences_per_minibatch ({per_mb}) / runtime.workers ({workers}) = {share} sequences per "
            f"worker is not divisible by trainer.micro_batch_sequences ({t.micro_batch_sequences}); pick "
            f"micro_batch_sequences dividing {share}"
        )
    return BatchSizes(
        sequences_per_step=per_step,
        sequences_per_minibatch=per_mb,
        minibatches_per_epoch=per_step // per_mb,
        micro_batches_per_minibatch=per_mb // (micro * workers),
        optimizer_steps_per_rl_step=(per_step // per_mb) * int(cfg.algo.epochs),
    )


def validate(cfg: Config, serving: bool = False) -> BatchSizes:
    """All cheap checks that must pass before models are built. ``serving``: for ``harness serve``, whose
    engine is not colocated with a trainer (the backend's own run checks are skipped)."""
    from rewards.registry import REGISTRY as checkers

    checkers.get(cfg.task.checker, ConfigError)
    check_backend(cfg, serving)
    check_vllm(cfg, serving)
    t = cfg.trainer
    if t.budget not in CHOICES["trainer.budget"]:
        raise ConfigError(f"trainer.budget={t.budget!r}: use steps, tokens or wall_s")
    if t.budget == "tokens" and t.budget_tokens <= 0:
        raise ConfigError("trainer.budget=tokens needs trainer.budget_tokens > 0 (generated tokens, e.g. 2000000)")
    if t.budget == "wall_s" and t.budget_wall_s <= 0:
        raise ConfigError("trainer.budget=wall_s needs trainer.budget_wall_s > 0 (seconds of training, e.g. 600)")
    frac = OmegaConf.select(cfg, "algo.entropy_token_frac", default=0.0)
    if not 0.0 <= float(frac) <= 1.0:
        raise ConfigError(f"algo.entropy_token_frac={frac}: a fraction of tokens in [0, 1] (0 = every token learns; "
                          f"0.2 = the top 20% by entropy, as in arXiv:2506.01939)")  # fmt: skip
    if t.eval_every < 1 and t.eval_every_tokens <= 0:
        raise ConfigError(f"trainer.eval_every={t.eval_every} must be >= 1 (or set trainer.eval_every_tokens > 0)")
    from harness.rundir.sinks import SINKS

    for sink in cfg.logging.sinks:
        if sink not in SINKS:
            close = difflib.get_close_matches(sink, SINKS, n=1)
            raise ConfigError(f"logging.sinks: unknown sink {sink!r}{f' (did you mean {close[0]!r}?)' if close else ''}; "
                              f"choose from {', '.join(SINKS)}")  # fmt: skip
    r = cfg.reward
    if r.source not in CHOICES["reward.source"]:
        raise ConfigError(f"reward.source={r.source!r}: use checker, model, mix or random")
    if r.source in REWARD_MODEL_SOURCES and not r.model_path:
        raise ConfigError(f"reward.source={r.source} needs reward.model_path (a `harness rm train` run's "
                          f"reward_model/ directory, or 'tiny' to train the arith one here)")  # fmt: skip
    if r.source == "mix" and not 0 <= r.model_weight <= 1:
        raise ConfigError(f"reward.model_weight={r.model_weight} must be in [0, 1]")
    if r.source == "random" and not 0 < r.random_rate < 1:
        raise ConfigError(f"reward.random_rate={r.random_rate} must be in (0, 1): the probability of reward 1 "
                          f"(the task's base rate, e.g. the start's sampled accuracy)")  # fmt: skip
    if t.max_skipped_steps < 1:
        raise ConfigError(f"trainer.max_skipped_steps={t.max_skipped_steps} must be >= 1 (steps with skipped updates "
                          f"in a row before the run stops)")  # fmt: skip
    if cfg.trainer.precision not in CHOICES["trainer.precision"]:
        raise ConfigError(f"trainer.precision={cfg.trainer.precision!r}: use fp32 or bf16")
    if cfg.model.dtype not in CHOICES["model.dtype"]:
        raise ConfigError(f"model.dtype={cfg.model.dtype!r}: use float32 or bfloat16")
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError(f"rollout.top_p={cfg.rollout.top_p} must be in (0, 1]")
    if cfg.rollout.top_k < 0:
        raise ConfigError(f"rollout.top_k={cfg.rollout.top_k} must be >= 0 (0 = off)")
    if cfg.rollout.temperature < 0:
        raise ConfigError(f"rollout.temperature={cfg.rollout.temperature} must be >= 0")
    if cfg.rollout.max_response_tokens < 1:
        raise ConfigError("rollout.max_response_tokens must be >= 1")
    if cfg.trainer.micro_batch_tokens < 0:
        raise ConfigError(f"trainer.micro_batch_tokens={cfg.trainer.micro_batch_tokens} must be >= 0 (0 = by sequences)")
    check_pipeline(cfg)
    check_composition(cfg)
    lora = cfg.model.lora
    if lora.rank < 0 or (lora.rank > 0 and (lora.alpha <= 0 or not 0 <= lora.dropout < 1 or not lora.target_modules)):
        raise ConfigError(f"model.lora: rank={lora.rank} (>= 0; 0 = full fine-tuning), alpha={lora.alpha} (> 0), "
                          f"dropout={lora.dropout} (in [0, 1)), target_modules={list(lora.target_modules)} (not empty)")
    if lora.roles and lora.rank == 0:
        raise ConfigError(f"model.lora.roles={list(lora.roles)} needs model.lora.rank > 0")
    check_env(cfg)
    from harness.runtime.workers.local import check_launcher

    settings = runtime_settings(cfg)
    check_launcher(settings.group, settings.train.fsdp_shard_size)
    tiny = cfg.model.tiny
    if cfg.model.path == "tiny" and tiny.hidden_size // tiny.num_heads < 32:
        raise ConfigError(
            f"model.tiny: head_dim = hidden_size/num_heads = {tiny.hidden_size // tiny.num_heads} < 32; "
            f"vLLM-CPU serves head_dim >= 32 only: raise model.tiny.hidden_size or lower num_heads"
        )
    if tiny.sft_steps < -1 or not 0 <= tiny.sft_accuracy_floor <= 1 or not 0 <= tiny.sft_min_steps <= tiny.sft_max_steps:
        raise ConfigError(f"model.tiny: sft_steps={tiny.sft_steps} (-1 = the sizing rule, N >= 0 = exactly N), "
                          f"sft_accuracy_floor={tiny.sft_accuracy_floor} (in [0, 1]), "
                          f"sft_min_steps={tiny.sft_min_steps} <= sft_max_steps={tiny.sft_max_steps}")
    if not 0 <= tiny.sft_direct_frac <= 1:
        raise ConfigError(f"model.tiny.sft_direct_frac={tiny.sft_direct_frac}: a fraction of problems, in [0, 1]")
    if tiny.sft_max_new_tokens < 0:
        raise ConfigError(f"model.tiny.sft_max_new_tokens={tiny.sft_max_new_tokens}: the build's held-out generation cap, "
                          f">= 0 (0 = rollout.max_response_tokens)")
    if not serving:
        check_tiny_teacher(cfg)
    return derive_batch_sizes(cfg)


def check_composition(cfg: Config) -> None:
    """``algo.advantage`` / ``algo.loss``: a registered part the algorithm can take (algorithms/parts.py), else
    one line saying why not; a part's parameters other than its paper's are logged."""
    import logging

    from algorithms import parts

    try:
        notes = parts.check(algorithms.build(cfg.algo))
    except (KeyError, ValueError) as exc:
        raise ConfigError(str(exc).strip("'\"")) from None
    for note in notes:
        logging.getLogger("harness.config").warning(note)


def teacher_model_config(model_cfg: Any, teacher: Any) -> Any:
    """``model`` config of the tiny teacher: model.tiny with ``teacher.*``'s changes (a copy)."""
    model = OmegaConf.create(OmegaConf.to_container(model_cfg, resolve=True))
    model.tiny.sft_steps = int(teacher.sft_steps)
    for key in ("hidden_size", "num_layers", "intermediate_size"):
        if int(teacher[key]):
            model.tiny[key] = int(teacher[key])
    return model


def role_setting(algo_cfg: Any, init: str, fallback: str) -> str:
    """The algo setting that gave a model role its weights ``init`` (e.g. 'algo.teacher_path'), for errors."""
    return next((f"algo.{k}" for k, v in algo_cfg.items() if v == init), fallback)


def check_tiny_teacher(cfg: Config) -> None:
    """A model role built as the tiny teacher (init 'tiny', e.g. a distillation teacher) shares the tiny
    student's tokenizer, so it needs model.path=tiny; teacher.* must make a buildable model."""
    bad = {k: v for k, v in cfg.teacher.items() if int(v) < 0}
    if bad:
        raise ConfigError(f"teacher: {bad} must be >= 0 (sft_steps: exactly N SFT steps; sizes: 0 = model.tiny's)")
    if not any(r.init == "tiny" for r in algorithms.build(cfg.algo).needs.roles):
        return
    setting = role_setting(cfg.algo, "tiny", "a model role's init")
    if cfg.model.path != "tiny":
        raise ConfigError(f"{setting}=tiny builds a tiny teacher with the tiny model's tokenizer, but model.path="
                          f"{cfg.model.path}: give {setting}=DIR (or a hub id), a model with the policy's tokenizer")  # fmt: skip
    hidden, heads = teacher_model_config(cfg.model, cfg.teacher).tiny.hidden_size, cfg.model.tiny.num_heads
    if hidden % heads:
        raise ConfigError(f"teacher.hidden_size={hidden} is not a multiple of model.tiny.num_heads={heads}")


def check_backend(cfg: Config, serving: bool = False) -> None:
    """``rollout.backend`` names a registered backend (harness/runtime/rollout/), and the selected one's checks pass."""
    from harness.runtime.rollout import backend_name, get_backend

    settings = runtime_settings(cfg)
    try:
        get_backend(settings.rollout.backend)  # the engine kind (also the one behind a rollout server)
        spec = get_backend(backend_name(settings.rollout))
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    if spec.check is not None and not serving:
        spec.check(settings)


# rollout.vllm.sleep_level values a colocated run may use. 2 discards the weights asleep: only the HF state dict a
# sync pushes comes back (not buffers or engine state outside it), and VLLMRollout.wake_up (generate on a sleeping
# engine, no push first) wakes them as whatever the freed memory then holds; level 1 keeps a CPU copy of them.
SLEEP_LEVELS = (1,)


def check_vllm(cfg: Config, serving: bool = False) -> None:
    """``rollout.vllm.*`` values that would corrupt a run silently, or fail only once vLLM is built (after the trainer's
    models): checked when vllm is the engine this command builds (a run's colocated one, or `harness serve`'s)."""
    r = cfg.rollout
    if r.backend != "vllm" or (r.server.url and not serving):  # another engine, or a server's (its own settings)
        return
    v = r.vllm
    if str(v.dtype).lower() not in ("", *CHOICES["rollout.vllm.dtype"]):  # vLLM lower-cases it
        raise ConfigError(f"rollout.vllm.dtype={v.dtype!r} is not a vLLM dtype: use "
                          f"{', '.join(CHOICES['rollout.vllm.dtype'])} (auto = float32 on CPU, the checkpoint's on GPU)")
    if not 0 < float(v.gpu_memory_utilization) <= 1:
        raise ConfigError(f"rollout.vllm.gpu_memory_utilization={v.gpu_memory_utilization} must be in (0, 1]: the "
                          f"fraction of the GPU's memory the engine takes for weights + KV cache (e.g. 0.4)")
    for name in ("tensor_parallel_size", "max_num_seqs", "weight_bucket_mb"):
        if int(v[name]) < 1:
            raise ConfigError(f"rollout.vllm.{name}={v[name]} must be >= 1")
    if float(v.kv_cache_gib) <= 0:
        raise ConfigError(f"rollout.vllm.kv_cache_gib={v.kv_cache_gib} must be > 0 (CPU: the engine's KV cache in GiB, e.g. 1)")
    if v.weight_transport not in CHOICES["rollout.vllm.weight_transport"]:
        raise ConfigError(f"rollout.vllm.weight_transport={v.weight_transport!r}: use auto, shm (a /dev/shm file the "
                          f"workers map) or rpc (bytes inside vLLM's RPC)")  # fmt: skip
    if int(v.max_model_len) < 0:
        raise ConfigError(f"rollout.vllm.max_model_len={v.max_model_len} must be >= 0 (0 = what the run needs)")
    if serving:  # a server's clients choose their response lengths; it never sleeps
        return
    if int(v.sleep_level) not in SLEEP_LEVELS:
        raise ConfigError(f"rollout.vllm.sleep_level={v.sleep_level}: use 1 (weights offloaded to CPU, KV cache dropped); "
                          f"level 2 discards the weights and a wake with no weight push (generate on a sleeping "
                          f"engine) would sample from garbage (buffers outside the pushed state dict too)")  # fmt: skip
    need = int(cfg.task.max_prompt_tokens) + max(int(r.max_response_tokens), int(r.eval_max_response_tokens))
    if 0 < int(v.max_model_len) < need:
        raise ConfigError(f"rollout.vllm.max_model_len={v.max_model_len} < task.max_prompt_tokens + the longest of "
                          f"rollout.max_response_tokens / eval_max_response_tokens = {need}: vLLM would stop responses at "
                          f"{v.max_model_len} tokens in all (silently truncated) or refuse long prompts; raise it to >= "
                          f"{need}, or 0 (what the run needs: {need})")  # fmt: skip


def check_pipeline(cfg: Config) -> None:
    """``trainer.pipeline`` and the off-policy correction (``correction.*``)."""
    from harness.runtime.driver.pipeline import PIPELINES, pipelined
    from harness.runtime.rollout import get_backend

    t, r = cfg.trainer, cfg.rollout
    if t.pipeline not in PIPELINES:
        close = difflib.get_close_matches(str(t.pipeline), PIPELINES, n=1)
        raise ConfigError(f"trainer.pipeline={t.pipeline!r}{f' (did you mean {close[0]!r}?)' if close else ''}: "
                          f"use {', '.join(PIPELINES)}")  # fmt: skip
    if t.max_staleness < 0:
        raise ConfigError(f"trainer.max_staleness={t.max_staleness} must be >= 0 (0 = every batch from the current weights)")
    if t.behaviour_logp not in CHOICES["trainer.behaviour_logp"]:
        raise ConfigError(f"trainer.behaviour_logp={t.behaviour_logp!r}: use behaviour (the rollout's log-probs) "
                          f"or recompute (the current weights')")  # fmt: skip
    from algorithms.corrections import REGISTRY as corrections

    c = cfg.correction
    weigh = corrections.get(str(c.name), ConfigError)
    on = c.name != "none"
    if on and not 0 <= c.low < c.cap:
        raise ConfigError(f"correction.low={c.low:g} and correction.cap={c.cap:g}: need 0 <= low < cap (the band "
                          f"[low, cap] of kept ratios)")  # fmt: skip
    why_low = getattr(weigh, "needs_low", "")
    if why_low and c.low <= 0:  # the correction says it needs a lower bound, and why
        raise ConfigError(f"correction.name={c.name} needs correction.low > 0 ({why_low}")
    if c.exclude_rejected and not on:
        raise ConfigError("correction.exclude_rejected=true with correction.name=none: nothing is rejected; name a "
                          "correction, or leave exclude_rejected false")  # fmt: skip
    if r.hf_dtype not in CHOICES["rollout.hf_dtype"]:
        raise ConfigError(f"rollout.hf_dtype={r.hf_dtype!r}: use {', '.join(CHOICES['rollout.hf_dtype'])}")
    from harness.runtime.rollout.quant import KINDS as quant_kinds

    if r.weight_quant not in quant_kinds:
        raise ConfigError(f"rollout.weight_quant={r.weight_quant!r}: use {', '.join(quant_kinds)}")
    if r.weight_quant != "none" and r.backend != "hf":
        raise ConfigError(f"rollout.weight_quant={r.weight_quant} dials the hf engine's weights; rollout={r.backend} "
                          f"serves its own (use rollout=hf)")  # fmt: skip
    if r.hf_dtype != "auto" and r.backend != "hf":
        raise ConfigError(f"rollout.hf_dtype={r.hf_dtype} sets the hf engine's weights; rollout={r.backend} has its own "
                          f"(rollout.vllm.dtype for vllm)")  # fmt: skip
    # top-p truncation, or an hf engine at another dtype (a mismatch dialled on purpose), is reported like staleness
    reported = (get_backend(r.backend).reports_logp or pipelined(t.pipeline, t.max_staleness) or truncates(r)
                or r.hf_dtype != "auto" or r.weight_quant != "none")  # fmt: skip
    if on and not reported:
        raise ConfigError(
            f"correction.name={c.name} corrects rollout-engine log-probs, which rollout={r.backend} with trainer.pipeline="
            f"sync does not report (it samples with the trainer's own weights and numerics): use rollout=vllm, a "
            f"pipelined trainer.pipeline (one_step_off, async), rollout.top_p < 1 or rollout.top_k > 0, "
            f"rollout.hf_dtype=bfloat16, or correction.name=none"
        )
    if on and pipelined(t.pipeline, t.max_staleness) and t.behaviour_logp == "behaviour":
        raise ConfigError(f"correction.name={c.name} with trainer.pipeline={t.pipeline} and trainer.behaviour_logp="
                          f"behaviour weighs nothing: a stale batch's old_logp is the rollout's own log-probs, so every "
                          f"weight is 1. Use trainer.behaviour_logp=recompute (the current weights' log-probs, corrected "
                          f"by the weights), or correction.name=none")  # fmt: skip
    if r.partial not in CHOICES["rollout.partial"]:
        close = difflib.get_close_matches(str(r.partial), CHOICES["rollout.partial"], n=1)
        raise ConfigError(f"rollout.partial={r.partial!r}{f' (did you mean {close[0]!r}?)' if close else ''}: use off, "
                          f"continue (unfinished sequences go on under new weights) or restart (they are sampled again)")  # fmt: skip
    if r.partial != "off" and (t.pipeline != "async" or t.max_staleness == 0):
        raise ConfigError(f"rollout.partial={r.partial} needs trainer.pipeline=async with trainer.max_staleness >= 1 (got "
                          f"pipeline={t.pipeline}, max_staleness={t.max_staleness}): only a producer running ahead "
                          f"has a batch in flight when the weights move")  # fmt: skip
    if r.partial != "off" and r.partial_chunk_tokens < 1:
        raise ConfigError(f"rollout.partial_chunk_tokens={r.partial_chunk_tokens} must be >= 1")
    if r.partial != "off" and cfg.env.name:
        raise ConfigError(f"rollout.partial={r.partial} with env.name={cfg.env.name}: multi-turn episodes are not "
                          f"interruptible yet; use rollout.partial=off")  # fmt: skip
    if pipelined(t.pipeline, t.max_staleness) and cfg.reward.source in REWARD_MODEL_SOURCES:
        raise ConfigError(f"trainer.pipeline={t.pipeline} with reward.source={cfg.reward.source}: the reward model "
                          f"scores on the trainer's workers; use trainer.pipeline=sync with a reward model")  # fmt: skip
    check_mask_replay(cfg)


def check_mask_replay(cfg: Config) -> None:
    """``rollout.mask_replay``: only a truncated sampler has a kept set, and only the paths that carry it per token."""
    r = cfg.rollout
    if not r.mask_replay:
        return
    if not truncates(r):
        raise ConfigError("rollout.mask_replay=true replays the kept set of a truncated sampler, and this one keeps the "
                          "whole vocabulary: set rollout.top_p < 1 or rollout.top_k > 0, or rollout.mask_replay=false")
    other = ("env.name" if cfg.env.name else "rollout.partial" if r.partial != "off" else
             "rollout.server.url" if r.server.url else "")  # fmt: skip
    if other:
        raise ConfigError(f"rollout.mask_replay=true with {other} set: the kept sets are recorded by a colocated engine's "
                          f"single-turn rollouts only (episodes, partial rollouts and a rollout server do not carry them "
                          f"yet); use rollout.mask_replay=false")  # fmt: skip


def check_env(cfg: Config) -> None:
    """The ``env.*`` group: a registered name and limits that leave room for a turn."""
    env = cfg.env
    if not env.name:
        return
    from harness.data import envs

    envs.REGISTRY.get(env.name, ConfigError)
    if env.max_turns < 1 or env.max_turn_tokens < 0 or not 0 <= env.demo_frac <= 1:
        raise ConfigError(f"env: max_turns={env.max_turns} (>= 1), max_turn_tokens={env.max_turn_tokens} (>= 0; 0 = "
                          f"the rest of rollout.max_response_tokens), demo_frac={env.demo_frac} (in [0, 1])")
    if cfg.reward.source in REWARD_MODEL_SOURCES:
        raise ConfigError(f"env.name={env.name} with reward.source={cfg.reward.source}: a reward model scores "
                          f"single-turn responses only; use reward.source=checker with an environment")


# Where each Hydra command writes by default: <root>/<its overrides> (harness/conf/harness.yaml's
# hydra.run.dir reads it through the harness_results_dir resolver).
RESULTS_DIRS = {"run": "results/runs", "eval": "results/evals", "rm": "results/reward_models"}
_results_dir = [RESULTS_DIRS["run"]]
_mode = ["run"]
HELP_HEADERS = {
    "run": """harness run: train one RL run (Hydra overrides: key=value ...).

Examples:
  harness run                                   # GRPO, tiny offline model, arith task, CPU
  harness run algo=grpo algo.kl_coef=0 seed=1
  harness run task=gsm8k model.path=Qwen/Qwen2.5-0.5B-Instruct
  harness run plugins=[my_pkg.my_algo] algo=my_algo

Results land in results/runs/<overrides>/ (config.yaml, metrics.jsonl, run.json,
checkpoints/); re-running the same command resumes from the last checkpoint.
`harness list` shows algorithms, checkers, tasks and model presets.""",
    "eval": """harness eval [RUN_DIR | MODEL_DIR | SWEEP_DIR] [--checkpoint step_N] [KEY=VALUE ...]: score a model on a
task's test split (greedy; samples=K: K samples per prompt, mean@K, pass@k and maj@K; 95% CIs).

Examples:
  harness eval                                                   # the tiny warm start on arith
  harness eval results/sweeps/quick/algo=grpo,seed=0             # a run's last checkpoint, on the run's task
  harness eval results/runs/default --checkpoint step_0000025    # another of its checkpoints
  harness eval model.path=Qwen/Qwen2.5-0.5B-Instruct task=gsm8k samples=8 eval_limit=200
  harness eval results/sweeps/quick --protocols greedy,maj@8 task.eval_prompts=1000   # every run of a sweep

A run directory lends its task, environment, rollout settings and precision unless the
command line sets them. Results land in results/evals/<run>/<step>/<overrides>/ for a run,
results/evals/<overrides>/ otherwise (run.json, metrics.jsonl, samples.jsonl).
A sweep directory: every run's final checkpoint (--checkpoints all: every checkpoint) once per
sample count of --protocols (greedy | mean@K | pass@K | maj@K; default greedy), into
<run>/evals/<step>/<setting>/; finished ones are skipped; `harness report` shows them.""",
    "rm": """harness rm train [KEY=VALUE ...]: a Bradley-Terry reward model on preference pairs.

Examples:
  harness rm train                                               # tiny model, arith right-vs-wrong pairs
  harness rm train rm.train_pairs=pairs/train.parquet rm.eval_pairs=pairs/test.parquet model.path=DIR

Results land in results/reward_models/<overrides>/ (the export: reward_model/, for
reward.model_path). The fields that matter: rm.*, model.*, task (for arith pairs).""",
}


def register_resolvers(mode: str = "run", subdir: str = "") -> None:
    """The resolvers harness/conf/harness.yaml uses; ``mode`` (run | eval | rm) picks the results
    root, ``subdir`` a folder below it (harness eval RUN_DIR: the run's name and step)."""
    from omegaconf import OmegaConf

    _results_dir[0] = "/".join(p for p in (RESULTS_DIRS[mode], subdir) if p)
    _mode[0] = mode
    for name, resolver in (("harness_help_header", lambda: HELP_HEADERS[_mode[0]]),("harness_run_name", run_name), ("harness_results_dir", lambda: _results_dir[0]),
                           ("harness_choices", choices_help)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)


# Keys whose meaning changed with their name: refused with the new key and what changed (old run directories keep
# them under their own name, so no report mixes the two meanings).
REPLACED_KEYS = {
    "rollout.top_p_replay": ("rollout.mask_replay", "the trainer now masks its logits to the rollout's kept set (top-p "
                             "and top-k) instead of the rollout renormalising its log-prob to the full softmax"),
    "rollout.correction": ("correction.name", "the correction has its own group, chosen by name (none: no correction)"),
    "rollout.tis_cap": ("correction.cap", "the correction has its own group: correction.name turns it on (tis, mask, "
                        "...; none: off), correction.cap is its upper bound"),
    "rollout.correction_low": ("correction.low", "the correction has its own group"),
}


def _replacement(key: str, value: str) -> str:
    """What to type instead of ``key=value`` (rollout.tis_cap=0 meant no correction; a cap > 0 meant tis)."""
    new = REPLACED_KEYS[key][0]
    if key == "rollout.tis_cap":
        try:
            cap = float(value)
        except ValueError:
            return f"{new}={value}"
        return "correction.name=none" if cap == 0 else f"correction.name=tis correction.cap={value}"
    return f"{new}={value}"


def truncates(r) -> bool:
    """Training rollouts sample from a truncated distribution (top-p or top-k): they record its log-probs."""
    return r.top_p < 1 or int(r.top_k) > 0


def check_renamed(overrides: list[str]) -> None:
    """A renamed key on the command line or in a preset: a one-line error naming the new key."""
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~").strip()
        if key in REPLACED_KEYS:
            new, why = REPLACED_KEYS[key]
            raise ConfigError(f"{key} is now {new}: {why}; use {_replacement(key, o.split('=', 1)[1] if '=' in o else '')}")
        if key in RENAMED_KEYS:
            raise ConfigError(f"{key} is now {RENAMED_KEYS[key]} (vLLM-only settings live under rollout.vllm, a rollout "
                              f"server's under rollout.server): use {RENAMED_KEYS[key]}{o[len(o.split('=', 1)[0]):]}")


def compose_config(overrides: list[str] | None = None) -> Any:
    """The composed config, as `harness run OVERRIDES` sees it (for scripts, benches, tests)."""
    from hydra import compose, initialize_config_module

    check_renamed(list(overrides or []))
    register_resolvers()
    register_configs()
    with initialize_config_module("harness.conf", version_base=None):
        return compose("harness", overrides=list(overrides or []))
