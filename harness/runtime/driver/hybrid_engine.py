"""HybridEngine: the driver's handle on the workers that train (FSDP2) and roll out.

Single controller: the loop in harness/trainer.py calls these methods; the engine
shards each call across a worker group (``runtime.workers``, ``runtime.launcher``, see
harness/runtime/workers/local.py) and merges the answers, so the loop is the same for one
in-process worker and for many Ray actors. Each ``Worker`` (harness/runtime/workers/worker.py)
holds the models and a colocated rollout engine; weights move from the trainer to its
rollout engine after every update (``sync_weights``).

Sharding: rollouts by prompt (with several workers each sample gets its own seed, so
what a prompt gets does not depend on the worker count); forward passes and updates by
rows of each minibatch, gradients summed across workers, so an optimizer step sees the
whole minibatch whatever the worker count.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from algorithms import Algorithm, Batch, Needs
from harness.data.envs import make_env
from harness.data.tasks import Example, render_prompt
from harness.runtime.driver.episodes import episode_tensors, observation_text, run_episodes
from harness.runtime.driver.partial import PartialCounts, generate_in_segments
from harness.runtime.driver.pipeline import pipelined
from harness.runtime.loading import load_tokenizer
from harness.runtime.rollout.base import (
    Generation,
    backend_name,
    decode_responses,
    get_backend,
    request_seeds,
)
from harness.runtime.settings import BatchSizes, DriverSettings
from harness.runtime.train.update import UpdateRequest, combine, micro_batches, sequence_tokens, split_rows
from harness.runtime.workers import make_group
from harness.runtime.workers.local import InProcessGroup
from harness.runtime.workers.worker import Worker

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def merge_generations(gens: list[Generation], pad_id: int) -> Generation:
    """Concatenate workers' generations (prompt order kept): pad prompts on the left,
    responses on the right, and renumber group ids."""

    def pad(tensors, value, left=False):
        width = max(t.shape[1] for t in tensors)
        out = []
        for t in tensors:
            fill = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)
            out.append(torch.cat([fill, t] if left else [t, fill], 1))
        return torch.cat(out, 0)

    offsets, total = [], 0
    for g in gens:
        offsets.append(total)
        total += int(g.group_ids.max()) + 1 if len(g.group_ids) else 0
    logps, kept = [g.rollout_logp for g in gens], [g.rollout_kept for g in gens]
    return Generation(
        prompt_ids=pad([g.prompt_ids for g in gens], pad_id, left=True),
        prompt_mask=pad([g.prompt_mask for g in gens], False, left=True),
        response_ids=pad([g.response_ids for g in gens], pad_id),
        response_mask=pad([g.response_mask for g in gens], False),
        truncated=torch.cat([g.truncated for g in gens]),
        group_ids=torch.cat([g.group_ids + off for g, off in zip(gens, offsets)]),
        rollout_logp=None if any(lp is None for lp in logps) else pad(logps, 0.0),
        rollout_kept=None if any(k is None for k in kept) else pad(kept, 0),
    )


class HybridEngine:
    """Builds the policy and the roles an algorithm ``needs`` (on the workers) and runs
    rollout, annotation and updates on them.

    Models, by name: ``policy`` (trained with the algorithm's loss) and one per declared
    ``Role`` (its per-token outputs go to ``batch.outputs[role.name]``; trainable roles are
    updated with their own loss after the policy). The engine knows no other model.
    ``rollout_only``: generation only, no training models (``harness eval``). ``tokenizer``: the
    driver's, when the caller has loaded it already.
    """

    def __init__(self, settings: DriverSettings, needs: Needs, model_path: str, sizes: BatchSizes,
                 rollout_only: bool = False, tokenizer: PreTrainedTokenizerBase | None = None):  # fmt: skip
        self.settings = s = settings
        self.needs = needs
        self.sizes = sizes
        self.tokenizer = tokenizer or load_tokenizer(model_path, s.model.trust_remote_code)
        # Pipelined (harness/runtime/driver/pipeline.py): a producer thread generates while the trainer's thread
        # trains. One worker in this process serves both at once (different models); worker processes
        # and actors take one command at a time, so calls from the two threads are serialised. The
        # rollout backends then report the sampled tokens' log-probs (the behaviour policy's).
        self.pipelined = pipelined(s.trainer.pipeline, s.trainer.max_staleness)
        # So do they where the behaviour is not the trainer's softmax: top-p sampling (the truncated distribution), or
        # an hf engine at another dtype than the trainer (rollout.hf_dtype: a mismatch dialled on purpose).
        return_logp = (self.pipelined or s.rollout.top_p < 1 or s.rollout.top_k > 0 or s.rollout.hf_dtype != "auto"
                       or s.rollout.weight_quant != "none")  # fmt: skip
        self.group = make_group(s.runtime, (s.worker(return_logp=return_logp), needs.roles, model_path, rollout_only))
        self.workers = self.group.size
        self._call_lock = threading.Lock()
        self._serialise = not isinstance(self.group, InProcessGroup)
        self.frees_memory = get_backend(backend_name(s.rollout)).frees_memory  # vllm's sleep mode
        infos = self._all(Worker.rollout_info)
        self.rollout_info = infos[0]
        self.worker_hosts = [info["host"] for info in infos]  # rank order; several = a multi-node group
        self.worker_devices = [info.get("device", "?") for info in infos]  # a GPU's UUID, or "cpu"
        self.pad_id = self.rollout_info["pad_id"]
        self._envs: dict = {}  # rendered prompt -> the environment state after reset (episodes copy it)
        self.micro = min(s.trainer.micro_batch_sequences, sizes.sequences_per_minibatch)
        self.micro_tokens = s.trainer.micro_batch_tokens  # > 0: micro-batches by tokens (train/update.py micro_batches)
        # Per-sample seeds make rollouts independent of the worker count (needed as soon as
        # prompts are split); one worker keeps the backend's own sampling unless asked.
        seeded = s.rollout.sample_seeds
        # A rollout server samples seeded too: a request repeated after the server restarted gets the same answer.
        # Pipelined, the rollout runs beside the update: it samples from its own seeded streams (``rng``,
        # reseeded per step by the loop), never from the global RNG the update may draw from.
        self.sample_seeds = (self.workers > 1 or bool(s.rollout.server.url) or self.pipelined) if seeded is None else seeded
        self.rng: torch.Generator | None = None  # where request seeds come from (None: torch's global RNG)
        # One optimizer step per batch: the behaviour policy *is* the current policy, so the
        # update's own first forward gives the old log-probs exactly (no extra pass).
        self.on_policy = sizes.optimizer_steps_per_rl_step == 1
        self.generated_tokens = 0  # training-time generation, the token budget
        # Partial rollouts (rollout.partial): sampling calls inside ``interruptible`` generate in segments
        # and let weight pushes through between them (harness/runtime/driver/partial.py).
        self._interrupt = threading.local()  # .checkpoint and .counts on the producer thread, inside interruptible()

    def _call(self, method: Callable, args_per_rank: list[tuple]) -> list:
        """``method`` (a ``Worker`` method, e.g. ``Worker.update``) on every worker, rank r with
        ``args_per_rank[r]``; results in rank order. The group sends the method's name to the worker
        processes or actors; call sites name the method itself, so a reader (or an IDE) can follow them."""
        if not self._serialise:
            return self.group.call(method.__name__, args_per_rank)
        with self._call_lock:
            return self.group.call(method.__name__, args_per_rank)

    def _all(self, method: Callable, *args) -> list:
        """``method(*args)`` on every worker; results in rank order."""
        return self._call(method, [args] * self.workers)

    def close(self) -> None:
        """Stop the workers (idempotent; worker processes and actors are also stopped at exit)."""
        group, self.group = getattr(self, "group", None), None
        if group is not None:
            group.close()

    # ---------------------------------------------- the in-process worker's objects
    def _local(self):
        if not isinstance(self.group, InProcessGroup):
            raise AttributeError("models live in worker processes (runtime.workers > 1 or launcher=ray)")
        return self.group.worker

    @property
    def models(self):
        return self._local().models

    @property
    def rollout_backend(self):
        return self._local().rollout_backend

    def _rollout_sleep(self) -> None:
        """Free the rollout engines' GPU memory while the trainers work (vllm sleep mode).

        The next generate or weight sync wakes them up again.
        """
        if self.frees_memory and not self.pipelined:  # pipelined, it is generating
            self._all(Worker.sleep_rollout)

    @property
    def policy(self):
        """The in-process worker's policy ``TrainEngine`` (tests, benchmarks)."""
        return self.models["policy"]

    @property
    def temperature(self) -> float:
        return self.settings.rollout.temperature or 1.0

    # ------------------------------------------------------------------ rollout
    @property
    def env_name(self) -> str:
        return self.settings.env.name

    def render(self, examples: list[Example]) -> list[str]:
        """Prompts as text; with an environment, its first messages (``Environment.reset``)."""
        if not self.env_name:
            return [render_prompt(ex.messages, self.tokenizer, self.settings.task.use_chat_template) for ex in examples]
        prompts = []
        for ex in examples:
            env = make_env(self.env_name, max_turns=self.settings.env.max_turns)
            prompts.append(render_prompt(env.reset(ex), self.tokenizer, self.settings.task.use_chat_template))
            self._envs[prompts[-1]] = env  # generate() starts each episode from a copy of the state the prompt shows
        return prompts

    def rollout(self, examples: list[Example], n: int, temperature: float | None = None, count: bool = True,
                max_tokens: int | None = None) -> Batch:  # fmt: skip
        """``n`` sampled responses per example (greedy if temperature == 0), at most ``max_tokens``
        each (default: the training cap when sampling, the eval cap when greedy); with an
        environment, ``n`` episodes per example.

        Tokens generated with ``count=True`` add to ``generated_tokens``, the training
        budget (every training-time generation counts, also regenerated or baseline ones).
        """
        truths = [ex.ground_truth for ex in examples]
        return self.generate(self.render(examples), truths, n, temperature, count, max_tokens)

    @contextlib.contextmanager
    def interruptible(self, checkpoint):
        """Sampling calls in this block, on this thread, generate in segments of ``rollout.partial_chunk_tokens``
        and call ``checkpoint()`` (which may let a weight push through; returns the version held) between them.
        Yields the ``PartialCounts`` of those calls, summed."""
        self._interrupt.checkpoint, self._interrupt.counts = checkpoint, PartialCounts()
        try:
            yield self._interrupt.counts
        finally:
            self._interrupt.checkpoint = self._interrupt.counts = None

    def _sample(self, prompts: list, n: int, max_tokens: int, temperature: float,
                seeds: list[int] | None) -> tuple[Generation, int]:  # fmt: skip
        """One sampling call; in ``interruptible``, in segments. The generation and the tokens it discarded
        (restarted sequences: generated, so in the budget, but not in the batch)."""
        checkpoint = getattr(self._interrupt, "checkpoint", None)
        if checkpoint is None or temperature == 0 or self.env_name:  # greedy calls (a baseline) hold the engine to the end
            return self._generate(prompts, n, max_tokens, temperature, seeds), 0
        p = self.settings.rollout
        gen, counts = generate_in_segments(
            lambda ctx, k, cap, sd: self._generate(ctx, k, cap, temperature, sd), prompts, n, max_tokens, seeds,
            reseed=lambda k: request_seeds(k, 1, self.rng) if self.sample_seeds else None, checkpoint=checkpoint,
            chunk_tokens=p.partial_chunk_tokens, eos_ids=self.rollout_info["eos_ids"], pad_id=self.pad_id,
            restart=p.partial == "restart",
        )  # fmt: skip
        self._interrupt.counts.add(counts)
        return gen, counts.discarded_tokens

    def _generate(self, prompts: list, n: int, max_tokens: int, temperature: float,
                  seeds: list[int] | None) -> Generation:  # fmt: skip
        """One sharded generate call: prompts (text or token ids) split by rows over the workers."""
        chunks = [c.tolist() for c in split_rows(len(prompts), self.workers)]
        gens = self._call(Worker.generate, [
            ([prompts[i] for i in c], n, max_tokens, temperature, self.settings.rollout.top_p,
             None if seeds is None else [seeds[i] for i in c], self.settings.rollout.top_k)
            for c in chunks
        ])  # fmt: skip
        gens = [g for g in gens if g is not None]
        return gens[0] if len(gens) == 1 else merge_generations(gens, self.pad_id)

    def generate(
        self, prompts: list[str], truths: list[str], n: int, temperature: float | None = None, count: bool = True,
        max_tokens: int | None = None,
    ) -> Batch:
        """``rollout`` for prompts already rendered (e.g. a batch's ``prompts``)."""
        r = self.settings.rollout
        temperature = r.temperature if temperature is None else temperature
        if max_tokens is None:
            max_tokens = r.max_response_tokens if temperature > 0 else (r.eval_max_response_tokens or r.max_response_tokens)
        # Sample j of prompt i: seed base + i*n + j, whatever the worker split. None: the backend
        # samples from torch's RNG (hf) or seeds requests itself (vllm).
        seeds = request_seeds(len(prompts), n, self.rng) if self.sample_seeds else None
        turn_cap = min(max_tokens, self.settings.env.max_turn_tokens or max_tokens) if self.env_name else max_tokens
        gen, discarded = self._sample(prompts, n, turn_cap, temperature, seeds)
        generated = int(gen.response_mask.sum()) + discarded
        if self.env_name:  # turn 1 was the single-turn call; the episodes go on from there
            fields, later = self._episodes(gen, prompts, n, max_tokens, temperature)
            generated += later  # every generated token, also those cut off at an episode's room
        else:
            fields = {"responses": decode_responses(self.tokenizer, gen.response_ids, gen.response_mask)}
        if count:
            self.generated_tokens += generated
        rows = gen.group_ids.tolist()
        return Batch(**{
            "prompt_ids": gen.prompt_ids, "prompt_mask": gen.prompt_mask, "response_ids": gen.response_ids,
            "response_mask": gen.response_mask, "group_ids": gen.group_ids, "prompts": [prompts[i] for i in rows],
            "ground_truths": [truths[i] for i in rows], "truncated": gen.truncated, "max_response_tokens": max_tokens,
            "rollout_logp": gen.rollout_logp,  # [B, T] the rollout engine's own log-probs (vllm)
            "rollout_kept": gen.rollout_kept,  # [B, T] its kept set's size under top-p / top-k (rollout.mask_replay)
            "token_version": gen.token_version,  # [B, T] the version that sampled each token (partial rollouts)
            **fields,
        })  # fmt: skip

    def _episodes(self, first: Generation, prompts: list[str], n: int, max_tokens: int,
                  temperature: float) -> tuple[dict, int]:  # fmt: skip
        """Play the episodes ``first`` began (harness/runtime/driver/episodes.py); the Batch fields they fill,
        and the tokens generated after turn 1."""
        env, tok = self.settings.env, self.tokenizer
        missing = [p for p in prompts if p not in self._envs]
        if missing:
            raise RuntimeError(f"env.name={self.env_name}: a prompt was not rendered by this engine (render()), so no "
                               f"environment state exists for it: {missing[0][:80]!r}")
        envs = [copy.deepcopy(self._envs[prompts[i]]) for i in first.group_ids.tolist()]  # one episode per sample
        eos = self.rollout_info["eos_ids"]
        wrap = self.settings.task.use_chat_template

        generated = [0]

        def generate(contexts, k, cap, seeds):
            gen = self._generate(contexts, k, cap, temperature, seeds)
            generated[0] += int(gen.response_mask.sum())
            return gen

        episodes = run_episodes(
            generate,
            decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
            encode=lambda text, eos_id: tok(observation_text(tok, text, wrap, tok.convert_ids_to_tokens([eos_id])),
                                            add_special_tokens=False)["input_ids"],
            first=first, envs=envs, eos_ids=eos, max_span_tokens=max_tokens,
            max_turn_tokens=env.max_turn_tokens, max_turns=env.max_turns,
            seeds=lambda k: request_seeds(k, 1, self.rng) if self.sample_seeds else None,
        )  # fmt: skip
        tensors = episode_tensors(episodes, self.pad_id)
        if first.rollout_logp is None:
            tensors["rollout_logp"] = None
        return {
            **tensors,
            "responses": [ep.env.final_answer(ep.turns) for ep in episodes],
            "truncated": torch.tensor([ep.truncated for ep in episodes]),
            "episode": {
                "turns": torch.tensor([len(ep.turns) for ep in episodes]),
                "tool_calls": torch.tensor([ep.tool_calls for ep in episodes]),
                "tool_errors": torch.tensor([ep.tool_errors for ep in episodes]),
                "end": [ep.end for ep in episodes],
            },
        }, generated[0]

    # ---------------------------------------------------------------- annotate
    def annotate(self, batch: Batch, needs: Needs) -> None:
        """Behaviour log-probs when the update cannot take them from its own first pass, and
        every declared role's per-token outputs (``batch.outputs[role.name]``)."""
        self._rollout_sleep()
        if needs.old_logp and batch.old_logp is None and (not self.on_policy or needs.logp_before_advantages):
            batch.old_logp = self.compute("policy", batch)
        for role in needs.roles:
            batch.outputs[role.name] = self.compute(role.name, batch)

    def compute(self, model: str, batch: Batch) -> torch.Tensor:
        """No-grad per-token outputs of ``model`` (log-probs; one scalar per token for a scalar head)."""
        shards = split_rows(len(batch), self.workers)
        tokens = sequence_tokens(batch)
        plans = [micro_batches(rows, tokens, self.micro, self.micro_tokens) for rows in shards]
        passes = max(len(p) for p in plans)
        args = []
        for rows, plan in zip(shards, plans):  # each rank: its rows, padded with dummy passes
            local = [torch.arange(start, start + len(idx)) for start, idx in zip(_starts(plan), plan)]
            mine = batch if self.workers == 1 else batch.select(rows if len(rows) else torch.zeros(1, dtype=torch.long))
            args.append((model, mine, local + [None] * (passes - len(plan)), self.temperature))
        return torch.cat(self._call(Worker.compute, args), 0)

    # ------------------------------------------------------------------- update
    def update(self, batch: Batch, algo: Algorithm, step_seed: int, train_policy: bool = True) -> dict[str, float]:
        """Train the policy with ``algo.loss`` (unless ``train_policy`` is False: a warm-up step of the
        other roles), then each trainable declared role with its own loss (same seed for the minibatch
        shuffle); returns step-averaged stats (``train/policy_frozen`` 1 on a warm-up step)."""
        self._rollout_sleep()
        entropy_grad = bool(getattr(algo, "entropy_grad", True))  # else the entropy is a metric, no autograd
        if train_policy:
            stats = self.train("policy", batch, algo.loss, algo.cfg.epochs, step_seed, entropy_grad)
        else:
            stats = {"train/skipped_steps": 0, "train/policy_frozen": 1}
        for role in self.needs.roles:
            if role.trainable:
                role_stats = self.train(role.name, batch, role.loss, role.epochs, step_seed)
                skipped = stats["train/skipped_steps"] + role_stats.pop("train/skipped_steps")
                stats |= role_stats | {"train/skipped_steps": skipped}
        return stats

    def train(self, model: str, batch: Batch, loss_fn, epochs: int, step_seed: int,
              entropy_grad: bool = True) -> dict[str, float]:  # fmt: skip
        """``epochs`` over ``batch`` of ``loss_fn(outputs, entropy, MicroBatch)`` on every worker
        (``Worker.update``); for the policy, old log-probs missing from the batch are the current
        policy's (on-policy: behaviour policy == current policy before the first step)."""
        t = self.settings.trainer
        request = UpdateRequest(model, batch, loss_fn, epochs, step_seed, self.sizes.sequences_per_minibatch,
                                self.micro, t.micro_batch_tokens, self.temperature, entropy_grad)  # fmt: skip
        parts = self._call(Worker.update, [(request,)] * self.workers)
        return combine(parts, "policy" if model == "policy" else model)

    # --------------------------------------------------------------- weight sync
    def sync_weights(self) -> float:
        """Push the trained weights into every worker's rollout engine; returns seconds taken."""
        t0 = time.perf_counter()
        self._all(Worker.sync_weights)
        return time.perf_counter() - t0

    def sync_check(self) -> dict[str, float]:
        """``Worker.sync_check`` of every worker, the worst one (rollout.verify_sync)."""
        parts = [p for p in self._all(Worker.sync_check) if p]
        return {k: max(p[k] for p in parts) for k in parts[0]} if parts else {}

    def memory_report(self) -> dict[str, float]:
        """Each phase's memory since the last report, the worst worker's (``Worker.memory_report``)."""
        parts = self._all(Worker.memory_report)
        return {k: max(p.get(k, 0.0) for p in parts) for k in sorted({k for p in parts for k in p})}

    def parameter_counts(self) -> dict[str, dict[str, int]]:
        """Trainable and total parameters of each trainable model (e.g. LoRA: the adapters only)."""
        return self._all(Worker.parameter_counts)[0]

    # -------------------------------------------------------------- checkpoints
    def save_state(self, checkpoint_dir: Path) -> dict:
        """Every worker rank writes its shards of the trainable models into ``checkpoint_dir/engine``
        (torch.distributed.checkpoint; the directory must be one every worker can reach, as the run
        directory is). Returns the small part for state.pt: the schedulers and where the shards are."""
        small = self._all(Worker.save_state, str(Path(checkpoint_dir) / "engine"))[0]
        return {"format": "sharded", "dir": "engine", "models": small}

    def export_policy(self, out_dir: Path, dtype: str | None) -> None:
        """The policy's weights as safetensors in ``out_dir``, streamed one gathered tensor at a time."""
        self._all(Worker.export_policy, str(out_dir), dtype)

    def load_state(self, state: dict, checkpoint_dir: Path) -> None:
        """Load what ``save_state`` wrote (each rank reads its own shards), or a full state
        from before the sharded format (rank 0 gets the tensors, the others receive them by broadcast)."""
        if state.get("format") == "sharded":
            self._all(Worker.load_saved, str(Path(checkpoint_dir) / state["dir"]), state["models"])
        else:
            light = {name: {k: v for k, v in s.items() if k == "scheduler"} for name, s in state.items()}
            self._call(Worker.load_state, [(state,)] + [(light,)] * (self.workers - 1))
        self.sync_weights()


def _starts(plan: list[torch.Tensor]) -> list[int]:
    """Offsets of consecutive chunks."""
    out, at = [], 0
    for chunk in plan:
        out.append(at)
        at += len(chunk)
    return out
