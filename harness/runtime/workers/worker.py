"""The training worker: one per process (or Ray actor) of a worker group.

A worker owns everything that holds weights: the policy's FSDP2 ``TrainEngine``, one
per ``Role`` the algorithm declares (built from the role's data, by name), and a
colocated rollout backend. ``update`` is the whole training update of one model, from the
driver's ``UpdateRequest`` (rows, seed, sizes): every rank derives the same shuffle and its own
share, and gets the same number of forward / backward passes (padding with dummy passes), so
FSDP's collectives stay in lockstep.

With one worker in the driver's process (``runtime.workers=1``, launcher ``local``) the
driver calls these methods directly: no copies, no pickling, today's path.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import time

import torch
import torch.distributed as dist

from algorithms import Batch, MicroBatch
from algorithms.base import Role
from algorithms.corrections import correction_stats, correction_weights, log_ratio
from harness.core.errors import TrainingDiverged
from harness.core.registry import import_plugins
from harness.runtime.loading import (
    is_sequence_classifier,
    load_causal_lm,
    load_sequence_classifier,
    load_tokenizer,
    local_snapshot,
    write_safetensors,
)
from harness.runtime.rollout.base import Generation, RolloutBackend, RolloutContext, build_backend
from harness.runtime.rollout.fingerprint import compare
from harness.runtime.settings import WorkerSettings
from harness.runtime.train import lora
from harness.runtime.train.fsdp import TrainEngine, ValueModel, init_distributed
from harness.runtime.train.meta_init import empty_causal_lm, empty_like_source
from harness.runtime.train.update import UpdateRequest, UpdateResult, rank_micro_batches, sequence_tokens
from harness.runtime.workers.phase_memory import PhaseMemory

log = logging.getLogger(__name__)


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def bf16_compute(settings: WorkerSettings) -> bool:
    """Whether the policy computes in bf16: trainer.precision=bf16, or model.dtype=bfloat16 with fully
    trained weights (fp32 masters, cast per layer by FSDP2's MixedPrecisionPolicy)."""
    model = settings.model
    return settings.trainer.precision == "bf16" or (model.dtype == "bfloat16" and not lora.enabled(model.lora))


def build_role_model(role: Role, model_path: str, dtype: str, trust: bool, empty: bool = True) -> torch.nn.Module:
    """A role's model: a causal LM (``head="lm"``), or its body with a scalar head, zero-initialised,
    or the trained head of a sequence-classification export (a reward model) when ``init`` is one.
    With ``empty`` the causal LM (or the scalar head's body) is built on the meta device, each rank then
    reading only its shards (train/meta_init.py), as the policy is."""
    path = model_path if role.init == "policy" else role.init
    if path == "tiny":  # the driver builds the tiny teacher and hands its directory (harness.trainer.resolve_role_models)
        raise ValueError(f"Role({role.name!r}).init='tiny' reached a worker unresolved: resolve_role_models first")
    if role.head == "scalar" and is_sequence_classifier(path):
        classifier = load_sequence_classifier(path, dtype, trust)
        model = ValueModel(classifier.model, classifier.config.hidden_size)
        with torch.no_grad():  # the export's score layer has no bias (harness/reward_model.py)
            model.value_head.weight.copy_(classifier.score.weight)
        return model
    lm = empty_causal_lm(path, dtype, trust) if empty else load_causal_lm(path, dtype, trust)
    if role.head == "lm":
        return lm
    return empty_like_source(ValueModel(lm.model, lm.config.hidden_size), lm)  # the body from the checkpoint


def rollout_context(settings: WorkerSettings, model_path: str, tokenizer, device: str) -> RolloutContext:
    """The run's facts a rollout backend is built from (harness/runtime/rollout/base.py)."""
    return RolloutContext(
        model_path=model_path, tokenizer=tokenizer, device=device, model_dtype=settings.model.dtype,
        trust_remote_code=settings.model.trust_remote_code, max_prompt_tokens=settings.task.max_prompt_tokens,
        share_prompts=settings.trainer.share_prompts,
        autocast_bf16=bf16_compute(settings),  # bf16 autocast with trainer.precision=bf16, or bf16 weights without adapters
        return_logp=settings.return_logp,  # pipelined runs: behaviour log-probs of batches the trainer gets later
        seed=settings.seed, settings=settings.rollout,
    )


def build_rollout(settings: WorkerSettings, model_path: str, tokenizer, device: str) -> RolloutBackend:
    """The rollout backend the run's rollout settings select (a registered one), on ``device``."""
    return build_backend(rollout_context(settings, model_path, tokenizer, device))


class FrozenBase:
    """A frozen role that is the policy's starting model, served by the LoRA policy with its
    adapters switched off (the same base weights, no copy)."""

    optimizer = None

    def __init__(self, policy: TrainEngine):
        self.policy = policy

    @torch.no_grad()
    def forward(self, batch, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False,
                kept: torch.Tensor | None = None):
        """The base's log-probs; ``kept`` (mask replay) is the policy's alone: the reference keeps its full softmax."""
        model = self.policy.model
        training = model.training
        model.eval()  # as a separately built frozen role runs: no dropout
        try:
            with lora.adapters_off(model):
                return self.policy.forward(batch, temperature, with_entropy, entropy_grad)
        finally:
            model.train(training)


class Worker:
    """The policy, the declared roles and a rollout backend, on this rank's device.

    ``roles``: the algorithm's ``Role``s (their losses are not called here at build time: the
    driver sends the loss with each ``train`` plan). With ``rollout_only`` no training model is
    built (``harness eval``: one copy of the weights).
    """

    def __init__(self, settings: WorkerSettings, roles: tuple[Role, ...], model_path: str, rollout_only: bool = False):
        self.settings = s = settings
        self.device = resolve_device(s.runtime.device)
        init_distributed(self.device)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.memory = PhaseMemory(self.device)  # each phase's peak, for the metrics (phase_memory.py)
        with self.memory.phase("load"):
            self._build(roles, model_path, rollout_only)

    def _build(self, roles: tuple[Role, ...], model_path: str, rollout_only: bool) -> None:
        """The policy, each declared role's model and the rollout backend, on this rank's device."""
        s = self.settings
        torch.manual_seed(s.seed)  # every rank builds identical initial weights
        trust = s.model.trust_remote_code
        if not os.path.exists(model_path) and s.model.path not in ("tiny", model_path):
            model_path = local_snapshot(s.model.path)  # the driver's cache dir is on another node
        self.tokenizer = load_tokenizer(model_path, trust)
        precision, dtype = s.trainer.precision, s.model.dtype
        # Trained parameters keep fp32 master weights: model.dtype=bfloat16 means bf16 compute (FSDP2's
        # MixedPrecisionPolicy casts each layer's gathered parameters for forward/backward, gradients are
        # reduced in fp32) and bf16 frozen copies. A bf16 master rounds away AdamW steps smaller than its
        # spacing: at lr 1e-6, 0.77% of a matrix moved in a step, against 99.97% in fp32 (docs/scale.md).
        master = "float32" if dtype == "bfloat16" else dtype
        compute = "bf16" if dtype == "bfloat16" else precision
        t = s.trainer
        share, pack, ckpt, shards = t.share_prompts, t.pack_sequences, t.gradient_checkpointing, s.runtime.fsdp_shard_size
        self.lora = s.model.lora if lora.enabled(s.model.lora) else None
        self.models: dict[str, TrainEngine | FrozenBase] = {}
        if not rollout_only:
            # Under LoRA the base is frozen (kept at model.dtype) and peft keeps the adapters in fp32.
            if self.lora is None:  # built empty: each rank reads only its own shards (train/meta_init.py)
                policy = empty_causal_lm(model_path, master, trust)
            else:
                policy = lora.add_adapters(load_causal_lm(model_path, dtype, trust), self.lora)
            policy_compute = precision if self.lora is not None else compute  # as bf16_compute says
            self.models["policy"] = TrainEngine(policy, self.device, policy_compute,
                                                t, share_prompts=share, pack=pack, checkpointing=ckpt, shard_size=shards)  # fmt: skip
            for role in roles:  # in declaration order: model construction draws from the seeded RNG
                if self.lora is not None and role.init == "policy" and role.head == "lm" and not role.trainable:
                    # The starting policy is the policy with its adapters off: no second copy.
                    self.models[role.name] = FrozenBase(self.models["policy"])
                    continue
                adapted = self.lora is not None and role.name in self.lora.roles
                full_training = role.trainable and not adapted  # fp32 masters, bf16 compute (above)
                # adapters go onto real parameters: an adapted role loads whole
                model = build_role_model(role, model_path, master if full_training else dtype, trust, empty=not adapted)
                if adapted:
                    model = lora.add_adapters(model, self.lora, trainable_too=("value_head",))
                lr = role.lr if role.lr is not None else role.lr_scale * t.lr
                opt = dataclasses.replace(t, lr=lr) if role.trainable else None  # the run's AdamW, the role's lr
                # fully trained roles: fp32 masters, bf16 compute; frozen and adapted ones compute as the policy
                self.models[role.name] = TrainEngine(model, self.device, compute if full_training else policy_compute, opt,
                                                     share_prompts=share, pack=pack, checkpointing=ckpt, shard_size=shards)  # fmt: skip
        import_plugins(list(s.plugins))  # a plugin's rollout backend, in a worker process too
        self.rollout_backend = build_rollout(s, model_path, self.tokenizer, self.device)
        if hasattr(self.rollout_backend, "verify_sync"):
            self.rollout_backend.verify_sync = s.rollout.verify_sync
            self.rollout_backend.verify_stride = s.rollout.verify_sync_stride

    def parameter_counts(self) -> dict[str, dict[str, int]]:
        """Per trainable model: trainable and total parameters (full sizes, whatever the sharding)."""
        out = {}
        for name, m in self.models.items():
            if isinstance(m, TrainEngine) and m.optimizer is not None:
                trainable, total = lora.count_parameters(m.model)
                out[name] = {"trainable": trainable, "total": total}
        return out

    def _model(self, name: str) -> TrainEngine:
        if name not in self.models:
            raise RuntimeError(f"no model {name!r} on this worker: built rollout_only (generation only)"
                               if not self.models else f"no model {name!r}: the algorithm declared {sorted(self.models)}")
        return self.models[name]

    def rollout_info(self) -> dict:
        """What the driver needs to merge workers' generations, and the host and device this worker runs on
        (run.json): a GPU by torch's UUID (nvidia-smi's process list is often empty inside containers)."""
        device = "cpu"
        if self.device == "cuda":
            device = f"GPU-{torch.cuda.get_device_properties(torch.cuda.current_device()).uuid}"
        return {"pad_id": int(self.rollout_backend.pad_id), "eos_ids": [int(e) for e in self.rollout_backend.eos_ids],
                "host": platform.node(), "device": device}

    # ------------------------------------------------------------------ rollout
    def generate(self, prompts: list[str] | list[list[int]], n: int, max_tokens: int, temperature: float, top_p: float,
                 seeds: list[int] | None, top_k: int = 0) -> Generation | None:  # fmt: skip
        """This worker's share of a rollout (None for an empty share). ``top_k`` goes to the backend only when set
        (a plugin backend without it keeps working at top_k 0)."""
        if not prompts:
            return None
        try:
            extra = {"top_k": top_k} if top_k else {}
            return self.rollout_backend.generate(prompts, n, max_tokens, temperature, top_p, seeds=seeds, **extra)
        except RuntimeError as exc:
            if "probability tensor contains" not in str(exc):
                raise
            raise TrainingDiverged(
                "sampling failed: the policy's next-token probabilities are not finite (inf/nan), its weights "
                "diverged; lower trainer.lr, and resume from an earlier checkpoint or start afresh") from None

    def sleep_rollout(self) -> None:
        """Free the rollout engine's GPU memory while training (vllm sleep mode; else no-op)."""
        sleep = getattr(self.rollout_backend, "sleep", None)
        if sleep is not None:
            sleep()

    # ----------------------------------------------------------- forward passes
    @torch.no_grad()
    def compute(self, model: str, batch: Batch, micro_plan: list, temperature: float) -> torch.Tensor:
        """No-grad per-token outputs [b, T] of ``model`` over the micro-batches in ``micro_plan``
        (row indices; None = a dummy pass that only keeps this rank in step with the others)."""
        engine, outs = self._model(model), []
        for idx in micro_plan:
            micro = batch.select(torch.zeros(1, dtype=torch.long) if idx is None else idx)
            out = engine.forward(micro, temperature, kept=self._replayed(model, micro))[0]
            if idx is not None:
                outs.append(out.cpu())
        return torch.cat(outs, 0) if outs else torch.zeros(0, batch.response_ids.shape[1])

    def _replayed(self, model: str, micro: Batch) -> torch.Tensor | None:
        """The rollout's kept-set sizes the policy's log-probs are masked to (rollout.mask_replay), else None: the
        reference and other roles keep their full distributions."""
        replay = model == "policy" and self.settings.rollout.mask_replay
        return micro.rollout_kept if replay else None

    def update(self, req: UpdateRequest) -> UpdateResult:
        """One model's update (``_update``), its memory measured as the ``train`` phase."""
        with self.memory.phase("train"):
            return self._update(req)

    def _update(self, req: UpdateRequest) -> UpdateResult:
        """One model's update: epochs > minibatches > this rank's share > micro-batches > forward/backward >
        optimizer step. Every rank derives the same shuffle and shares from ``req.seed``; gradients
        accumulate over micro-batches and sum over ranks (losses use the whole minibatch's totals), so an
        optimizer step sees the whole minibatch whatever the worker count. Returns this rank's sums."""
        engine, batch, result = self._model(req.model), req.batch, UpdateResult()
        if req.model == "policy":
            batch = self._exclude_rejected(engine, batch, req.temperature, result)
        n, per_minibatch = len(batch), req.sequences_per_minibatch
        tokens = sequence_tokens(batch)
        shuffle = torch.Generator().manual_seed(req.seed)
        steps = []  # per optimizer step: epoch, the minibatch's (tokens, sequences), this rank's micro-batches
        for epoch in range(req.epochs):
            order = torch.randperm(n, generator=shuffle) if per_minibatch < n or req.epochs > 1 else torch.arange(n)
            for minibatch in order.split(per_minibatch):
                totals = float(batch.response_mask[minibatch].sum()), float(len(minibatch))
                steps.append((epoch, totals, rank_micro_batches(minibatch, tokens, self.rank, self.world_size,
                                                                req.micro_batch_sequences, req.micro_batch_tokens)))
        own = [rows for _, _, micros in steps for rows in micros if rows is not None]
        dummy = batch.select(torch.cat(own).min().view(1) if own else torch.zeros(1, dtype=torch.long))  # its first row
        for epoch, totals, micros in steps:
            for rows in micros:
                if rows is None:  # a dummy pass: zero gradient, the same collectives as the other ranks
                    out, _ = engine.forward(dummy, req.temperature)
                    (out.sum() * 0.0).backward()
                else:
                    self._micro_step(engine, req, batch.select(rows), totals, epoch, result)
            result.grad_norms.append(engine.optimizer_step())
        result.lr = engine.scheduler.get_last_lr()[0]
        return result

    def _exclude_rejected(self, engine: TrainEngine, batch: Batch, temperature: float, result: UpdateResult) -> Batch:
        """correction.exclude_rejected: the tokens the correction drops (weight 0) taken off the response mask before
        the update, so they leave the loss's denominator and the KL and entropy terms (verl's way), and logged as
        ``rollout/excluded_token_frac``. The weights need old_logp for every row first: on a synchronous run (no
        recorded behaviour log-probs) one no-grad pass computes it, as the first micro-step would have."""
        corr = self.settings.correction
        if not (corr.on and corr.exclude_rejected) or batch.rollout_logp is None:
            return batch
        if batch.old_logp is None:
            with torch.no_grad():
                old = engine.forward(batch, temperature, kept=self._replayed("policy", batch))[0].detach().cpu()
            batch = dataclasses.replace(batch, old_logp=old)
        mask = batch.response_mask
        weights = correction_weights(corr.name, batch.old_logp.float().cpu(), batch.rollout_logp.float(), mask, corr.low,
                                     corr.cap)  # fmt: skip
        kept = mask & (weights > 0)
        result.add({"rollout/excluded_token_frac": float((mask & ~kept).sum()) / max(float(mask.sum()), 1.0)},
                   float(mask.sum()))  # fmt: skip
        # the model still reads every token (attention and positions follow context_mask); only the losses skip them
        return dataclasses.replace(batch, response_mask=kept, context_mask=batch.attention_mask)

    def _micro_step(self, engine: TrainEngine, req: UpdateRequest, micro: Batch, totals: tuple[float, float],
                    epoch: int, result: UpdateResult) -> None:  # fmt: skip
        """Forward, the loss (with the off-policy correction where the rollout's log-probs came along), backward."""
        is_policy = req.model == "policy"
        out, entropy = engine.forward(micro, req.temperature, with_entropy=is_policy, entropy_grad=req.entropy_grad,
                                      kept=self._replayed(req.model, micro))  # fmt: skip
        if is_policy and micro.old_logp is None:  # on-policy: behaviour policy == current policy
            micro.old_logp = out.detach().cpu()
        corr, rollout_logp = self.settings.correction, micro.rollout_logp if is_policy else None
        pg_weight = None
        if rollout_logp is not None:  # old_logp: the trainer's policy that generated (before any step)
            old, rollout_logp = micro.old_logp.float().cpu(), rollout_logp.float()
            if corr.on:  # correction.name (algorithms/corrections.py)
                pg_weight = correction_weights(corr.name, old, rollout_logp, micro.response_mask, corr.low, corr.cap)
            if epoch == 0:  # the gap and the mismatch metrics are logged for the first pass over the batch
                result.add_gap((old - rollout_logp).abs()[micro.response_mask])
                result.add_mismatch(old, rollout_logp, micro.response_mask, pg_weight)
        mb = MicroBatch(micro, totals[0], totals[1], self.settings.rollout.max_response_tokens, pg_weight=pg_weight)
        loss, stats = req.loss_fn(out, entropy, mb)
        # Losses are normalised by minibatch totals over all ranks; FSDP averages the ranks' gradients, so
        # scale back up to their sum.
        (loss * self.world_size if self.world_size > 1 else loss).backward()
        tokens = float(micro.response_mask.sum())
        if entropy is not None:
            mask = micro.response_mask.to(entropy.device)
            stats["policy/entropy"] = float((entropy.detach() * mask).sum() / max(tokens, 1.0))
        if pg_weight is not None and micro.response_mask.any():
            ratio = log_ratio(micro.old_logp.float().cpu(), rollout_logp, micro.response_mask)
            stats |= correction_stats(pg_weight, ratio, micro.response_mask, corr.cap, corr.name)
        result.add(stats, tokens)

    # -------------------------------------------------------------- weights
    def sync_weights(self) -> float:
        """Gather the trained policy and load it into this worker's rollout engine; seconds."""

        t0 = time.perf_counter()
        with self.memory.phase("sync"):
            self._sync_weights()
        return time.perf_counter() - t0

    def _sync_weights(self) -> None:
        # The engine's dtype (vLLM's bf16 on GPU) applied on the device, unless adapters are merged
        # after (in fp32, then cast by the engine).
        engine_dtype = getattr(self.rollout_backend, "dtype", None) if self.lora is None else None
        policy = self._model("policy")
        streams = getattr(self.rollout_backend, "streams_weights", False)
        if self.lora is not None:  # the rollout engine serves the plain model: W0 + (alpha/r) B A, merged as gathered
            weights = lora.merged_stream(policy.full_tensors(), lora.scaling(self.lora))
            if not streams:
                weights = dict(weights)
        elif streams:  # one gathered tensor at a time
            weights = policy.full_tensors(engine_dtype)
        else:  # a backend that wants the whole state as a dict (remote, plugins)
            weights = dict(policy.full_tensors(engine_dtype))
        self.rollout_backend.load_weights(weights)

    def memory_report(self) -> dict[str, float]:
        """Each phase's peak and after-phase memory since the last report (phase_memory.py), in GiB."""
        return self.memory.report()

    def sync_check(self) -> dict[str, float]:
        """After a weight sync: does the rollout engine hold every tensor that was sent, where it was sent?
        Per-tensor fingerprints (rollout/fingerprint.py): the worst relative difference (~1e-16 when every
        tensor landed, order 1e-5 or more when one is stale, lost or in another layer) and how many differ."""
        backend = self.rollout_backend
        sent = getattr(backend, "sent_fingerprints", None)
        if sent is None or not hasattr(backend, "weight_fingerprints"):
            return {}
        report = compare(sent, backend.weight_fingerprints())
        if report.mismatched:
            log.warning("weight sync: the rollout engine differs from what was sent in %d of %d tensors: %s",
                        len(report.mismatched), report.tensors, ", ".join(report.mismatched[:5]))  # fmt: skip
        return report.metrics()

    def save_state(self, path: str) -> dict:
        """Every rank writes its shards of each trainable model into ``path/<model>`` (``TrainEngine.save_sharded``);
        returns the small unsharded parts (schedulers) of each."""
        with self.memory.phase("checkpoint"):
            return {name: m.save_sharded(os.path.join(path, name)) for name, m in self.models.items()
                    if getattr(m, "optimizer", None) is not None}  # fmt: skip

    def load_saved(self, path: str, small: dict) -> None:
        """Load a ``save_state`` directory."""
        for name, model_small in small.items():
            self.models[name].load_sharded(os.path.join(path, name), model_small)

    def load_state(self, state: dict) -> None:
        """Load a full state (checkpoints written before the sharded format); ranks > 0 get only the
        schedulers' state and receive the tensors by broadcast from rank 0."""
        for name, model_state in state.items():
            self.models[name].load_state(model_state)

    def export_policy(self, out_dir: str, dtype: str | None) -> None:
        """The policy's weights as safetensors files in ``out_dir`` (a Hugging Face directory's weights), gathered
        one tensor at a time and written by rank 0: no rank holds the model. A collective. LoRA: see the driver."""
        tensors = self._model("policy").full_tensors(getattr(torch, dtype) if dtype else None)
        with self.memory.phase("checkpoint"):
            if self.rank == 0:
                write_safetensors(tensors, out_dir)
            else:
                for _ in tensors:  # every rank takes part in every gather
                    pass

    def close(self) -> None:
        close = getattr(self.rollout_backend, "close", None)
        if close is not None:
            close()
