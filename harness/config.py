"""The composed config: each group's dataclass, defined next to its reader, registered in Hydra's ConfigStore.

Groups: ``algo`` (one node per registered algorithm, see algorithms/); ``model``, ``trainer``, ``rollout``,
``correction``, ``runtime`` (harness/runtime/settings.py); ``task`` (harness/data/tasks.py); ``env``
(harness/data/envs); ``logging`` (harness/rundir/sinks.py); and the driver's own, defined here (``reward``,
``rm``, ``teacher``). Every field has a one-line doc; batch sizes carry their unit in the name. ``validate`` checks derived sizes before any model
is built, so a bad override fails in a second, not after the warm start.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

import algorithms
from harness.core.errors import ConfigError as ConfigError  # re-exported for the layers above
from harness.data.envs import EnvConfig
from harness.data.tasks import TaskConfig, registered_tasks
from harness.rundir.schema import RENAMED_KEYS
from harness.rundir.schema import budget_spec as budget_spec
from harness.rundir.sinks import LoggingConfig
from harness.runtime.settings import (
    BatchSizes,
    CorrectionConfig,
    DriverSettings,
    ModelConfig,
    RolloutConfig,
    RuntimeConfig,
    TrainerConfig,
)


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
    "runtime.launcher": ("local", "ray"),
    "runtime.device": ("auto", "cpu", "cuda"),
}


def choices_help() -> str:
    """The help footer's list of enumerated fields and their values (registries: `harness list`)."""
    from algorithms.corrections import REGISTRY as corrections
    from harness.runtime.rollout.quant import KINDS as quant_kinds
    from harness.runtime.rollout.vllm import DTYPES, WEIGHT_TRANSPORTS

    listed = {**CHOICES, "correction.name": tuple(corrections.names()),  # its registry's (plugins included)
              "rollout.weight_quant": quant_kinds,  # the dial's own list
              "rollout.vllm.dtype": DTYPES, "rollout.vllm.weight_transport": WEIGHT_TRANSPORTS}  # the backend's
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


G = TypeVar("G")  # a config group's dataclass


def group(cls: type[G], node: object) -> G:
    """A config group's node as its dataclass (read-only). A node loaded from a run's config.yaml is untyped
    (``lr: 1`` is an int there): the schema types it, its defaults fill a key an older run lacks."""
    if isinstance(node, cls):
        return node
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), node))
    except ConfigKeyError as exc:  # the schema names the key, nested ones too
        known = ", ".join(f.name for f in fields(exc.object_type)) if is_dataclass(exc.object_type) else "?"
        raise ConfigError(f"{exc.full_key}: not a field of {cls.__name__}; known: {known}") from None
    except ValidationError as exc:  # a value of the wrong type (`lr: abc` in a hand-edited config.yaml)
        raise ConfigError(f"{exc.full_key}: {str(exc.msg).splitlines()[0]} ({cls.__name__})") from None


def runtime_settings(cfg: Config) -> DriverSettings:
    """The one assembly step: the runtime's groups of the composed config as their dataclasses, each
    handed as it is (harness/runtime/settings.py). The runtime never reads the composed config itself."""
    return DriverSettings(
        seed=int(cfg.seed),
        model=group(ModelConfig, cfg.model),
        trainer=group(TrainerConfig, cfg.trainer),
        rollout=group(RolloutConfig, cfg.rollout),
        correction=group(CorrectionConfig, cfg.correction),
        runtime=group(RuntimeConfig, cfg.runtime),
        env=group(EnvConfig, cfg.env),
        task=group(TaskConfig, cfg.task),
        plugins=tuple(cfg.plugins),
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
    settings = runtime_settings(cfg)  # the runtime's groups, built once for the checks below
    check_backend(settings, serving)
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

    check_launcher(settings.runtime)
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


def teacher_model_config(model_cfg: ModelConfig, teacher: TeacherConfig) -> ModelConfig:
    """``model`` config of the tiny teacher: model.tiny with ``teacher.*``'s changes (a copy)."""
    model = OmegaConf.create(OmegaConf.to_container(model_cfg, resolve=True))
    model.tiny.sft_steps = int(teacher.sft_steps)
    for key in ("hidden_size", "num_layers", "intermediate_size"):
        if int(teacher[key]):
            model.tiny[key] = int(teacher[key])
    return model


def role_setting(algo_cfg: algorithms.AlgoConfig, init: str, fallback: str) -> str:
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


def check_backend(settings: DriverSettings, serving: bool = False) -> None:
    """``rollout.backend`` names a registered backend (harness/runtime/rollout/), and its registration's checks pass:
    the engine's own values wherever this command builds it (a run's colocated engine, or `harness serve`'s), the
    selected backend's run checks on a run, and no setting that only another engine reads."""
    from harness.runtime.rollout import backend_name, get_backend, registered_backends

    r = settings.rollout
    try:
        engine = get_backend(r.backend)  # the engine kind (also the one behind a rollout server)
        spec = get_backend(backend_name(r))
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    defaults = RolloutConfig()
    for owner in registered_backends().values():
        for name in owner.owns if owner.name != r.backend else ():
            if getattr(r, name) != getattr(defaults, name):
                raise ConfigError(f"rollout.{name}={getattr(r, name)} is read by the {owner.name} engine only; "
                                  f"rollout={r.backend} ignores it: use rollout={owner.name}, or leave rollout.{name} at "
                                  f"{getattr(defaults, name)}")  # fmt: skip
    if engine.check_engine is not None and (serving or not r.server.url):  # a server's engine: its own settings
        engine.check_engine(r)
    if spec.check is not None and not serving:
        spec.check(settings)


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
