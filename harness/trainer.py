"""The training loop, readable top to bottom (``train``), and its small helpers.

Every algorithm runs through the same loop; what differs lives in algorithms/.
Determinism: data order derives from ``seed``; before each step every RNG is reseeded
from (seed, step), so a run resumed from a checkpoint continues exactly as an
uninterrupted one would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

import algorithms
import rewards
from algorithms import Batch
from algorithms.base import REFERENCE, Needs
from harness.config import budget_spec, validate
from harness.envs import make_env
from harness.errors import ConfigError, TrainingDiverged
from harness.models import bf16_is_emulated, cpu_flags, load_tokenizer, resolve_model, save_policy_dir
from harness.results import RunDir
from harness.reward_model import check_tokenizer, resolve_reward_model
from harness.runtime import lora
from harness.runtime.engine import HybridEngine
from harness.runtime.episodes import episode_metrics
from harness.runtime.pipeline import Produced, RolloutPipeline
from harness.runtime.remote import check_server
from harness.runtime.worker import resolve_device
from harness.scoring import REWARD_MODEL, Reward, ended, eval_policy, last_token_values, reward_model_role
from harness.tasks import Example, check_prompts, load_task

log = logging.getLogger(__name__)


class PromptStream:
    """Endless, seeded shuffle of the training prompts; its position is checkpointed."""

    def __init__(self, examples: list[Example], prompts_per_step: int, seed: int):
        self.examples, self.per_step, self.seed = examples, prompts_per_step, seed
        self.position = 0  # prompts handed out so far

    def _order(self, epoch: int) -> list[int]:
        return torch.randperm(len(self.examples), generator=torch.Generator().manual_seed(self.seed * 7919 + epoch)).tolist()

    def next(self) -> list[Example]:
        out = []
        while len(out) < self.per_step:
            epoch, offset = divmod(self.position, len(self.examples))
            out.append(self.examples[self._order(epoch)[offset]])
            self.position += 1
        return out


def seed_of(seed: int, step: int) -> int:
    """The seed of RL step ``step`` of a run seeded ``seed``."""
    return (seed * 1_000_003 + step) % (2**31)


def seed_everything(seed: int, step: int) -> int:
    step_seed = seed_of(seed, step)
    random.seed(step_seed)
    np.random.seed(step_seed)
    torch.manual_seed(step_seed)
    return step_seed


def budget_spent(trainer: Any, generated_tokens: int, wall_s: float) -> bool:
    """True once a tokens or wall-clock budget is used up (a steps budget ends the loop itself)."""
    if trainer.budget == "tokens":
        return generated_tokens >= trainer.budget_tokens
    if trainer.budget == "wall_s":
        return wall_s >= trainer.budget_wall_s
    return False


def eval_due(trainer: Any, step: int, tokens_before: int, tokens_after: int) -> bool:
    """Evaluate after this step? Every ``eval_every_tokens`` generated tokens when set (so runs
    of algorithms with different tokens per step are evaluated at the same budget points),
    else every ``eval_every`` steps."""
    every = trainer.eval_every_tokens
    if every > 0:
        return tokens_after // every > tokens_before // every
    return step % trainer.eval_every == 0


def _checked(algo, method: str, out: Any, kind: type) -> tuple[Any, dict[str, float]]:
    """``out`` of ``algo.<method>``, with an error naming the fix for the older one-value protocol."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], kind) and isinstance(out[1], dict)):
        raise TypeError(f"{type(algo).__name__}.{method} must return ({kind.__name__}, metrics dict); got "
                        f"{type(out).__name__}. Return `value, {{}}` when there are no metrics.")
    return out


@dataclass
class Rollout:
    """One step's batch as the rollout side produced it (harness/runtime/pipeline.py may run it ahead)."""

    batch: Batch
    outcomes: dict[str, float]  # the reward's metrics (accuracy, ...)
    select_metrics: dict[str, float]
    tokens: int  # tokens generated for it (refills and extra generation included): the budget's unit
    prompt_position: int  # the prompt stream's position after it (checkpointed with the step that trains on it)
    rollout_s: float
    score_s: float
    select_s: float


class EngineSampler:
    """The ``Sampler`` an algorithm's ``select`` gets: generation through the engine scored by the
    run's reward, every token counted in the budget."""

    def __init__(self, engine: HybridEngine, prompts: PromptStream, reward: Reward, samples_per_prompt: int):
        self.engine, self.prompts, self.reward, self.n = engine, prompts, reward, samples_per_prompt

    def more(self) -> Batch:
        batch = self.engine.rollout(self.prompts.next(), n=self.n)
        self.reward(batch)
        return batch

    def generate(self, prompts: list[str], ground_truths: list[str], n: int, temperature: float) -> Batch:
        # The training length cap at any temperature: these responses are training data.
        batch = self.engine.generate(prompts, ground_truths, n, temperature, max_tokens=self.engine.cfg.rollout.max_response_tokens)
        self.reward(batch)
        return batch


def with_reward_model(needs: Needs, rm_path: str | None) -> tuple[Needs, Needs]:
    """(the roles the engine builds, what ``annotate`` computes each step). With a reward model it is
    one more frozen role, scored with the rollouts (not in annotate); the reference and the behaviour
    log-probs are then always computed, for ``kl/from_start``, the x-axis of the over-optimisation
    figure."""
    if rm_path is None:
        return needs, needs
    roles = needs.roles if needs.has(REFERENCE.name) else (*needs.roles, REFERENCE)
    annotate = dataclasses.replace(needs, roles=roles, old_logp=True, logp_before_advantages=True)
    return dataclasses.replace(annotate, roles=(*roles, reward_model_role(rm_path))), annotate


def kl_from_start(batch: Batch) -> dict[str, float]:
    """``kl/from_start``: KL(policy || starting policy) per sequence, the sampled estimate
    sum_t (log pi(y_t) - log pi_0(y_t)) over response tokens, averaged over the batch."""
    mask = batch.response_mask.float()
    per_seq = ((batch.old_logp.float() - batch.ref_logp.float()) * mask).sum(-1)
    return {"kl/from_start": float(per_seq.mean())}


def rollout_metrics(batch: Batch) -> dict[str, float]:
    lengths = batch.response_mask.sum(-1).float()
    _, inverse = torch.unique(batch.group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1
    g_max = torch.full((groups,), -float("inf")).scatter_reduce(0, inverse, batch.scores, "amax")
    g_min = torch.full((groups,), float("inf")).scatter_reduce(0, inverse, batch.scores, "amin")
    return {
        "reward/mean": float(batch.scores.mean()),
        "reward/accuracy": float(batch.correct.float().mean()),
        "rollout/response_tokens_mean": float(lengths.mean()),
        "rollout/truncated_frac": float(batch.truncated.float().mean()),
        "rollout/zero_std_group_frac": float((g_max == g_min).float().mean()),
        "rollout/generated_tokens": int(lengths.sum()),
        "rollout/sequences": len(batch),
        **episode_metrics(batch.episode),  # env/turns_mean, env/tool_calls_mean, ... (an environment's episodes)
    }


class StopSignals:
    """SIGTERM or SIGINT while training: finish the current step, checkpoint, exit 0 with a resume
    hint (SLURM sends SIGTERM ahead of a time limit or preemption). A second Ctrl-C stops at once."""

    def __enter__(self) -> StopSignals:
        self.received: str | None = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        log.warning("%s received: stopping after this step (checkpoint, then exit 0)", self.received)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def train(cfg: Any, run_dir: str, console: Console | None = None) -> dict[str, Any]:
    """Run (or resume) one RL run in ``run_dir``; returns the final run.json content."""
    console = console or Console()
    sizes = validate(cfg)  # every cheap check before any model is built
    if cfg.rollout.url:  # a rollout server that is not there fails the run now, not after the models load
        check_server(cfg.rollout.url, cfg.rollout.url_connect_s)
    if cfg.runtime.threads > 0:  # e.g. 1 per run when several runs share a machine
        torch.set_num_threads(cfg.runtime.threads)
    with RunDir(run_dir, cfg) as run:  # locked: a second writer is refused
        if run.finished(cfg):  # a relaunched sweep: nothing to train, so no model is loaded
            console.print(f"{run.path}: already finished ({budget_spec(cfg.trainer)}); skipping")
            return run.info
        with StopSignals() as stop:
            return _train(cfg, sizes, run, console, stop)


def _train(cfg: Any, sizes: Any, run: RunDir, console: Console, stop: StopSignals) -> dict[str, Any]:
    algo = algorithms.build(cfg.algo)
    checker = rewards.get(cfg.task.checker)
    task = load_task(cfg.task)
    eval_set = task.test[: cfg.task.eval_prompts]
    model_path, model_info = resolve_model(cfg.model, task, checker, cfg.rollout.max_response_tokens, console, cfg.env)
    tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
    examples = None
    if cfg.env.name:  # the prompts the model sees: the environment's first messages (e.g. its system message)
        examples = [Example(make_env(cfg.env.name, max_turns=cfg.env.max_turns).reset(ex), ex.ground_truth)
                    for ex in task.train[:512]]  # fmt: skip
    check_prompts(task, tokenizer, examples, expect_template=cfg.model.path != "tiny")  # before any model is built
    if "sft_steps" in model_info:
        console.print(
            f"tiny model: {model_info['params']:,} params, warm start {model_info['sft_steps']} SFT steps "
            f"in {model_info['sft_seconds']:.1f} s, held-out accuracy {model_info['sft_holdout_accuracy']:.3f} "
            f"({model_info['source']}; weights sha256 {model_info['weights_sha256'][:12]})"
        )
    console.print(
        f"[bold]{algo.name}[/] on {task.name} ({len(task.train)} train / {len(eval_set)} eval prompts), "
        f"{sizes.sequences_per_step} sequences/step, {sizes.optimizer_steps_per_rl_step} optimizer step(s)/step, "
        f"checker {checker.tag} -> {run.path}"
    )
    rm_path, rm_info = None, None
    if cfg.reward.source != "checker":
        if algo.learns_from_verdicts:
            raise ConfigError(f"algo={algo.name} learns from the checker's right/wrong verdicts, so a reward model "
                              f"cannot be its only signal: use reward.source=checker, or another algorithm")  # fmt: skip
        rm_path, rm_info = resolve_reward_model(cfg, model_info, console)
        check_tokenizer(rm_path, tokenizer, cfg.model.trust_remote_code)
        console.print(f"reward: {cfg.reward.source} ({rm_path}); the checker {checker.tag} scores every rollout as gold")
    check_lora_roles(cfg, algo)
    warn_emulated_bf16(cfg)
    torch.manual_seed(cfg.seed)
    engine_needs, annotate_needs = with_reward_model(algo.needs, rm_path)
    engine = HybridEngine(cfg, engine_needs, model_path, sizes, tokenizer=tokenizer)
    model_scores = None
    if rm_path is not None:
        def model_scores(batch: Batch) -> torch.Tensor:
            scored = ended(batch, engine.tokenizer.eos_token_id)  # truncated responses get the EOS it scores at
            return last_token_values(engine.compute(REWARD_MODEL, scored), scored.response_mask)
    reward = Reward(checker, cfg.reward.source, cfg.reward.model_weight, model_scores)
    try:
        return _loop(cfg, run, console, stop, engine, algo, checker, reward, annotate_needs, task, model_path,
                     model_info, rm_info)  # fmt: skip
    finally:
        engine.close()


def check_lora_roles(cfg: Any, algo) -> None:
    """model.lora.roles must name trainable models the algorithm declares."""
    trainable = sorted(r.name for r in algo.needs.roles if r.trainable)
    unknown = [name for name in cfg.model.lora.roles if name not in trainable]
    if unknown:
        raise ConfigError(f"model.lora.roles={list(cfg.model.lora.roles)}: algo={algo.name} declares no trainable "
                          f"model named {unknown}; its trainable models besides the policy: {trainable or 'none'}")


def warn_emulated_bf16(cfg: Any) -> None:
    """bf16 training or weights on a CPU that only emulates bf16: say so before a slow run starts."""
    bf16 = cfg.trainer.precision == "bf16" or cfg.model.dtype == "bfloat16"
    if bf16 and resolve_device(cfg.runtime.device) == "cpu" and bf16_is_emulated():
        log.warning("bf16 (trainer.precision=%s, model.dtype=%s) on a CPU without bf16 instructions (flags: %s): "
                    "torch emulates it, often several times slower than fp32; use trainer.precision=fp32 "
                    "model.dtype=float32 here", cfg.trainer.precision, cfg.model.dtype, cpu_flags())


def _loop(cfg, run: RunDir, console: Console, stop: StopSignals, engine: HybridEngine, algo, checker, reward: Reward,
          needs: Needs, task, model_path: str, model_info: dict, rm_info: dict | None) -> dict[str, Any]:  # fmt: skip
    """The RL loop, top to bottom: rollout, score, select, annotate, advantages, update, sync."""
    eval_set, eval_key = task.test[: cfg.task.eval_prompts], f"eval/{task.name}/accuracy"
    prompts = PromptStream(task.train, cfg.trainer.prompts_per_step, cfg.seed)
    run.start(cfg, checker.tag, model_info)
    tuning = {**lora.describe(cfg.model.lora), "parameters": engine.parameter_counts()}
    t, r = cfg.trainer, cfg.rollout
    pipeline_info = {  # what the report's pipeline column shows
        "mode": t.pipeline, "max_staleness": {"sync": 0, "one_step_off": 1}.get(t.pipeline, int(t.max_staleness)),
        "behaviour_logp": t.behaviour_logp if engine.pipelined else "current weights",
        "correction": f"{r.correction} {r.tis_cap:g}" if r.tis_cap > 0 else "none",
    }
    run.write_info(model_path=model_path, algorithm=algo.describe(), tuning=tuning, pipeline=pipeline_info,  # the knobs a report shows per row
                   reward={"source": cfg.reward.source, **({"model": rm_info} if rm_info else {}),
                           **({"model_weight": cfg.reward.model_weight} if cfg.reward.source == "mix" else {})})

    # Resume from the newest loadable checkpoint, or evaluate the starting policy.
    start, history, wall_s = 0, [], 0.0
    trained_tokens = 0  # tokens generated for the batches trained on so far: the token budget
    found = run.load_latest_checkpoint()
    if found is not None:
        ckpt, state = found
        engine.load_state(state["engine"])
        algo_state = state.get("algo")
        if algo_state is not None and hasattr(algo, "load_state"):
            algo.load_state(algo_state)
        start, prompts.position = state["step"], state["prompt_position"]
        wall_s, engine.generated_tokens = state["wall_s"], state["generated_tokens"]
        trained_tokens = engine.generated_tokens
        history = run.truncate_metrics(start)
        console.print(f"resumed from {ckpt.name} (step {start})")
    else:
        run.truncate_metrics(-1)
        seed_everything(cfg.seed, 0)
        first = {"step": 0, **eval_policy(engine, eval_set, checker, task.name)}
        run.log(first)
        history = [first]

    def checkpoint(step: int) -> None:
        state = {
            "step": step, "prompt_position": prompt_position, "wall_s": wall_s,
            "generated_tokens": trained_tokens, "engine": engine.state(),
            "algo": algo.state() if hasattr(algo, "state") else None,
        }
        policy = state["engine"]["policy"]["model"]
        run.save_checkpoint(step, state, export=lambda d: save_policy_dir(
            policy, model_path, engine.tokenizer, d / "policy", cfg.model.trust_remote_code,
            cfg.model.lora if lora.enabled(cfg.model.lora) else None, cfg.model.dtype))

    sampler = EngineSampler(engine, prompts, reward, algo.samples_per_prompt)
    prompt_position = prompts.position  # after the last batch trained on (a pipeline reads further ahead)

    def produce(step: int) -> Rollout:
        """Step ``step``'s batch: generated, scored and selected, with the rollout engine's weights."""
        seed_everything(cfg.seed, step)
        tokens_before, t0 = engine.generated_tokens, time.perf_counter()
        batch = engine.rollout(prompts.next(), n=algo.samples_per_prompt)
        t1 = time.perf_counter()
        outcomes = reward(batch)  # the training reward; the checker's verdicts too, whatever the source
        t2 = time.perf_counter()
        batch, select_metrics = _checked(algo, "select", algo.select(batch, sampler), Batch)  # filters, refills, extra generation
        return Rollout(batch, outcomes, select_metrics, engine.generated_tokens - tokens_before, prompts.position,
                       rollout_s=t1 - t0, score_s=t2 - t1, select_s=time.perf_counter() - t2)  # fmt: skip

    skipped_in_a_row = 0  # RL steps whose update was skipped (non-finite gradients or rewards)
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), TextColumn("{task.fields[line]}"), console=console, transient=False,
    )
    with progress, contextlib.ExitStack() as closing:
        # The bar counts in the budget's unit (steps, generated tokens or seconds).
        used = {"steps": lambda: step, "tokens": lambda: trained_tokens, "wall_s": lambda: wall_s}[cfg.trainer.budget]
        limit = {"steps": cfg.trainer.steps, "tokens": cfg.trainer.budget_tokens, "wall_s": cfg.trainer.budget_wall_s}
        step = start
        bar = progress.add_task(f"{algo.name}", total=limit[cfg.trainer.budget], completed=used(), line="")
        pipeline = None
        if cfg.trainer.pipeline != "sync":  # a producer thread generates ahead (harness/runtime/pipeline.py)
            pipeline = RolloutPipeline(produce, engine.sync_weights, cfg.trainer.pipeline, cfg.trainer.max_staleness,
                                       first=start + 1, last=cfg.trainer.steps)  # fmt: skip
            closing.callback(pipeline.close)  # also on errors and early stops: the producer ends with the loop
        for step in range(start + 1, cfg.trainer.steps + 1):
            if budget_spent(cfg.trainer, trained_tokens, wall_s):
                break  # resumed from the checkpoint that used up a tokens/wall budget
            tokens_before = trained_tokens
            t0 = time.perf_counter()
            if pipeline is None:  # sync: generate now, with the weights of the last update
                produced, waited = Produced(step, produce(step), step - 1, 0.0, 0.0), None
            else:
                produced, waited = pipeline.get(step)
            rollout = produced.item
            step_seed = seed_of(cfg.seed, step)
            batch, outcomes, select_metrics = rollout.batch, rollout.outcomes, rollout.select_metrics
            trained_tokens += rollout.tokens
            prompt_position = rollout.prompt_position
            if produced.staleness() > 0 and cfg.trainer.behaviour_logp == "behaviour":
                batch.old_logp = batch.rollout_logp  # the policy that generated it (None: the engine reports none)
            t_select = time.perf_counter()
            engine.annotate(batch, needs)  # behaviour log-probs, declared roles' outputs
            if reward.source != "checker":
                outcomes |= kl_from_start(batch)
            t_logp = time.perf_counter()
            bad_rewards = int((~torch.isfinite(batch.scores)).sum())
            if bad_rewards:  # a reward function returned inf/nan: no update from this batch
                log.warning("step %d: %d non-finite reward(s) (reward.source=%s, checker %s); update skipped", step,
                            bad_rewards, reward.source, checker.tag)  # fmt: skip
                advantage_metrics, stats = {}, {"train/skipped_steps": 1, "train/nonfinite_rewards": bad_rewards}
            else:
                batch.advantages, advantage_metrics = _checked(algo, "advantages", algo.advantages(batch), torch.Tensor)
                stats = engine.update(batch, algo, step_seed)  # the policy, then trainable roles
            t_update = time.perf_counter()
            if pipeline is None:
                sync_s = engine.sync_weights()
            else:  # waits for a generation in flight: weights never change under one
                wait_sync_s, sync_s = pipeline.synced()
            step_s = time.perf_counter() - t0
            wall_s += step_s
            metrics = {"step": step, **rollout_metrics(batch), **outcomes, **select_metrics, **advantage_metrics, **stats}
            metrics |= {
                "budget/generated_tokens": trained_tokens,  # all training-time generation of the batches trained on
                "budget/wall_s": wall_s,
                "perf/step_s": step_s,
                "perf/rollout_s": rollout.rollout_s,
                "perf/score_s": rollout.score_s,
                "perf/logp_s": rollout.select_s + (t_logp - t_select),  # select (filters, refills) and annotate
                "perf/update_s": t_update - t_logp,
                "perf/sync_s": sync_s,
                "perf/rollout_tokens_per_s": metrics["rollout/generated_tokens"] / max(rollout.rollout_s, 1e-9),
            }
            if pipeline is not None:  # what overlapped: the generation the trainer did not wait for
                metrics |= {
                    "rollout/policy_version": produced.version,
                    "rollout/staleness_mean": float(produced.staleness()),
                    "rollout/staleness_max": produced.staleness(),
                    "perf/wait_rollout_s": waited + wait_sync_s,  # the trainer idle: its batch, or a generation in flight
                    "perf/wait_train_s": produced.idle_s,  # the producer idle: held back by the staleness bound
                    "perf/overlap_frac": max(0.0, 1.0 - waited / max(produced.produce_s, 1e-9)),
                }
            skipped_in_a_row = skipped_in_a_row + 1 if metrics.get("train/skipped_steps") else 0
            diverged = skipped_in_a_row >= cfg.trainer.max_skipped_steps
            last = step == cfg.trainer.steps or budget_spent(cfg.trainer, trained_tokens, wall_s)
            if (eval_due(cfg.trainer, step, tokens_before, trained_tokens) or last) and not diverged:
                t_eval = time.perf_counter()
                with pipeline.rollout_lock if pipeline else contextlib.nullcontext():  # the weights of this update
                    metrics |= eval_policy(engine, eval_set, checker, task.name)
                metrics["perf/eval_s"] = time.perf_counter() - t_eval
            run.log(metrics)
            history.append(metrics)
            if diverged:  # no checkpoint of this step: the last one written holds good weights
                raise TrainingDiverged(_diverged_message(run, step, skipped_in_a_row, metrics))
            last_eval = next((h[eval_key] for h in reversed(history) if eval_key in h), float("nan"))
            progress.update(
                bar, completed=used(),
                line=f"reward {metrics['reward/mean']:.3f}  eval acc {last_eval:.3f}  {step_s:.2f} s/step",
            )
            every = cfg.trainer.checkpoint_every
            if (every and step % every == 0) or last or stop.received:
                checkpoint(step)
            if stop.received and not last:
                run.write_info(status="interrupted", steps_done=step, wall_s=round(wall_s, 2),
                               generated_tokens=trained_tokens)  # fmt: skip
                console.print(f"[yellow]stopped[/] by {stop.received} after step {step} (checkpoint written): "
                              f"rerun the same command to resume")  # fmt: skip
                return run.info
            if last:
                break
    return _finish(run, console, history, eval_key, cfg, wall_s, trained_tokens)


def _diverged_message(run: RunDir, step: int, in_a_row: int, metrics: dict) -> str:
    norms = ", ".join(f"{k} {v}" for k, v in metrics.items() if k.endswith("/grad_norm"))
    last = run.latest_checkpoint()
    return (f"step {step}: the update was skipped {in_a_row} steps in a row for non-finite values ({norms or 'rewards'}"
            f"{', non-finite rewards ' + str(metrics['train/nonfinite_rewards']) if 'train/nonfinite_rewards' in metrics else ''}); "
            f"the run stopped (trainer.max_skipped_steps). Lower trainer.lr or check the reward function; "
            f"{'the last checkpoint, ' + last.name + ', holds the weights before it' if last else 'no checkpoint was written'}")  # fmt: skip


def _finish(run: RunDir, console: Console, history: list[dict], eval_key: str, cfg: Any, wall_s: float,
            generated_tokens: int) -> dict[str, Any]:  # fmt: skip
    evals = [h[eval_key] for h in history if eval_key in h]
    summary = {
        "status": "finished",
        "steps_done": history[-1]["step"],
        "budget": budget_spec(cfg.trainer),
        "wall_s": round(wall_s, 2),
        "generated_tokens": generated_tokens,
        "eval_first": evals[0] if evals else None,
        "eval_final": evals[-1] if evals else None,
        "eval_best": max(evals) if evals else None,
        "eval_metric": eval_key,
    }
    run.write_info(**summary)
    console.print(
        f"[bold green]done[/]: {eval_key} {summary['eval_first']:.3f} -> {summary['eval_final']:.3f} "
        f"(best {summary['eval_best']:.3f}) in {wall_s:.0f} s of training; results in {run.path}"
    )
    return run.info
