"""HybridEngine: the trained policy (FSDP2), optional frozen reference, and a rollout backend.

Weights move from the trainer to the rollout engine after every update
(``sync_weights``). Everything that knows about devices, FSDP or generation
backends lives here; the loop in harness/trainer.py only calls these methods.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

from algorithms import Algorithm, Batch, MicroBatch, Needs
from harness.models import load_causal_lm, load_tokenizer
from harness.runtime.rollout_hf import HFRollout
from harness.runtime.train_engine import TrainEngine, init_distributed
from harness.tasks import Example, render_prompt


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


class HybridEngine:
    def __init__(self, cfg: Any, needs: Needs, model_path: str, sizes: Any):
        self.cfg = cfg
        self.needs = needs
        self.sizes = sizes
        self.device = resolve_device(cfg.runtime.device)
        init_distributed(self.device)
        trust = cfg.model.trust_remote_code
        self.tokenizer = load_tokenizer(model_path, trust)
        precision = cfg.trainer.precision
        self.policy = TrainEngine(load_causal_lm(model_path, cfg.model.dtype, trust), self.device, precision, cfg.trainer)
        self.reference = None
        if needs.reference:
            self.reference = TrainEngine(load_causal_lm(model_path, cfg.model.dtype, trust), self.device, precision)
        if needs.critic or needs.prm:
            raise NotImplementedError("critic/PRM models arrive with the PPO/PRIME algorithms")
        if cfg.rollout.backend != "hf":
            raise NotImplementedError(f"rollout.backend={cfg.rollout.backend!r} is not available yet; use rollout=hf")
        rollout_model = load_causal_lm(model_path, "float32" if self.device == "cpu" else cfg.model.dtype, trust)
        self.rollout_backend = HFRollout(rollout_model.to(self.device), self.tokenizer, cfg.task.max_prompt_tokens)
        self.micro = min(cfg.trainer.micro_batch_sequences, sizes.sequences_per_minibatch)
        # One optimizer step per batch: the behaviour policy *is* the current policy, so the
        # update's own first forward gives the old log-probs exactly (no extra pass).
        self.on_policy = sizes.optimizer_steps_per_rl_step == 1

    # ------------------------------------------------------------------ rollout
    def render(self, examples: list[Example]) -> list[str]:
        return [render_prompt(ex.messages, self.tokenizer, self.cfg.task.use_chat_template) for ex in examples]

    def rollout(self, examples: list[Example], n: int, temperature: float | None = None) -> Batch:
        """``n`` sampled responses per example (greedy if temperature == 0)."""
        r = self.cfg.rollout
        temperature = r.temperature if temperature is None else temperature
        max_tokens = r.max_response_tokens if temperature > 0 else (r.eval_max_response_tokens or r.max_response_tokens)
        prompts = self.render(examples)
        gen = self.rollout_backend.generate(prompts, n, max_tokens, temperature, r.top_p)
        responses = self.rollout_backend.decode(gen.response_ids, gen.response_mask)
        return Batch(
            prompt_ids=gen.prompt_ids,
            prompt_mask=gen.prompt_mask,
            response_ids=gen.response_ids,
            response_mask=gen.response_mask,
            group_ids=gen.group_ids,
            prompts=[prompts[i] for i in gen.group_ids.tolist()],
            responses=responses,
            ground_truths=[examples[i].ground_truth for i in gen.group_ids.tolist()],
            truncated=gen.truncated,
        )

    # ---------------------------------------------------------------- annotate
    def annotate(self, batch: Batch, needs: Needs, checker=None) -> None:
        """Fill the extra per-token quantities the algorithm declared in ``needs``."""
        temp = self.cfg.rollout.temperature or 1.0
        if needs.old_logp and (not self.on_policy or needs.logp_before_advantages):
            batch.old_logp = self.policy.compute_logp(batch, self.micro, temp)
        if needs.reference:
            batch.ref_logp = self.reference.compute_logp(batch, self.micro, temp)
        if needs.greedy_baseline:
            raise NotImplementedError("greedy baseline arrives with ReMax")

    # ------------------------------------------------------------------- update
    def update(self, batch: Batch, algo: Algorithm, step_seed: int) -> dict[str, float]:
        """Epochs x minibatches x micro-batches of ``algo.loss``; exact gradient accumulation."""
        n = len(batch)
        per_mb = self.sizes.sequences_per_minibatch
        shuffle = torch.Generator().manual_seed(step_seed)
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        grad_norms = []
        temp = self.cfg.rollout.temperature or 1.0
        for _epoch in range(algo.cfg.epochs):
            order = torch.randperm(n, generator=shuffle) if per_mb < n or algo.cfg.epochs > 1 else torch.arange(n)
            for mb_index in order.split(per_mb):
                minibatch = batch.select(mb_index)
                mb_tokens = float(minibatch.response_mask.sum())
                for micro_index in torch.arange(len(minibatch)).split(self.micro):
                    micro = minibatch.select(micro_index)
                    logp, entropy = self.policy.forward_logp(micro, temp, with_entropy=True)
                    if micro.old_logp is None:  # on-policy: behaviour policy == current policy
                        micro.old_logp = logp.detach().cpu()
                    mb = MicroBatch(micro, mb_tokens, float(len(minibatch)), self.cfg.rollout.max_response_tokens)
                    loss, stats = algo.loss(logp, entropy, mb)
                    loss.backward()
                    tokens = float(micro.response_mask.sum())
                    mask = micro.response_mask.to(entropy.device)
                    stats["policy/entropy"] = float((entropy.detach() * mask).sum() / max(tokens, 1.0))
                    for key, value in stats.items():  # token-weighted means over the step
                        sums[key] += float(value) * tokens
                        weights[key] += tokens
                grad_norms.append(self.policy.optimizer_step())
        out = {k: sums[k] / max(weights[k], 1.0) for k in sums}
        out["policy/grad_norm"] = sum(grad_norms) / len(grad_norms)
        out["policy/lr"] = self.policy.scheduler.get_last_lr()[0]
        return out

    # --------------------------------------------------------------- weight sync
    def sync_weights(self) -> float:
        """Push the trained weights into the rollout engine; returns seconds taken."""
        t0 = time.perf_counter()
        self.rollout_backend.load_weights(self.policy.full_state_dict())
        return time.perf_counter() - t0

    # -------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        return {"policy": self.policy.state()}

    def load_state(self, state: dict) -> None:
        self.policy.load_state(state["policy"])
        self.sync_weights()
