"""Generate and score: the one path from task examples to checker verdicts.

Every place that turns prompts into scored responses goes through here: the loop's
rollouts and extra generation (``score``), the in-training eval and ``harness eval``
(``generate_and_score`` over the HybridEngine, so ``rollout=vllm`` and workers apply),
and the warm start's held-out checks (the same function over ``ModelGenerator``, an
in-memory model being fine-tuned). Rendering, chunking, length caps and scoring are
then the same everywhere, so an offline eval of a checkpoint reproduces the number the
run logged at that step.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Protocol

import torch
from rich.progress import Progress

from algorithms import Batch
from algorithms.base import Role
from harness.data.tasks import Example, render_prompt
from harness.runtime.driver.episodes import episode_metrics
from harness.runtime.settings import RolloutConfig


class Generator(Protocol):
    """What ``generate_and_score`` needs: the HybridEngine's ``rollout``."""

    def rollout(self, examples: list[Example], n: int, temperature: float | None = None, count: bool = True,
                max_tokens: int | None = None) -> Batch: ...  # fmt: skip


def score(batch: Batch, checker) -> list:
    """Score every response of ``batch`` with ``checker``: sets ``scores``/``correct``; returns the verdicts."""
    verdicts = checker.score_batch(batch.responses, batch.ground_truths)
    batch.scores = torch.tensor([v.score for v in verdicts], dtype=torch.float32)
    batch.correct = torch.tensor([v.correct for v in verdicts], dtype=torch.bool)
    return verdicts


REWARD_MODEL = "reward_model"  # the role name of a reward model on the workers


def reward_model_role(path: str) -> Role:
    """A frozen reward model served by the runtime like a critic: built on every worker, run in
    micro-batches, its scalar head read at each response's last token."""
    return Role(REWARD_MODEL, init=path, head="scalar", trainable=False)


def ended(batch: Batch, eos_id: int) -> Batch:
    """``batch`` with an EOS appended to every truncated response (a copy; token ids and mask
    only), so each response ends in the token a reward model was trained to score at."""
    if not bool(batch.truncated.any()):
        return batch
    ids = torch.nn.functional.pad(batch.response_ids, (0, 1), value=eos_id)
    mask = torch.nn.functional.pad(batch.response_mask, (0, 1), value=False)
    rows = batch.truncated.nonzero()[:, 0]
    ends = batch.response_mask.long().sum(-1)[rows]
    ids[rows, ends], mask[rows, ends] = eos_id, True
    return dataclasses.replace(batch, response_ids=ids, response_mask=mask, rollout_logp=None, rollout_kept=None, old_logp=None,
                               outputs={}, token_rewards=None, advantages=None, returns=None)  # fmt: skip


def last_token_values(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """[B] a scalar head's per-token outputs [B, T] at each response's last token, its EOS (see
    ``ended``). Output t is the head on the state before token t: at the EOS it has read the whole
    response, as ``harness rm train`` and the exported classifier score it. Empty responses: t = 0."""
    last = (response_mask.long().sum(-1) - 1).clamp(min=0)
    return values.gather(1, last.to(values.device)[:, None])[:, 0].float().cpu()


class Reward:
    """The training reward of a batch, from one of the reward sources.

    ``checker``: the task's rule checker. ``model``: a reward model's score. ``mix``:
    ``model_weight * model + (1 - model_weight) * checker``. ``random``: the control of Spurious
    Rewards (Shao et al., arXiv 2506.10947): 1 with probability ``random_rate``, drawn per response
    independently of what it says (``random_rewards``). The checker scores every batch whatever the
    source (``batch.correct`` stays its verdict: the gold reward), so a run trained on a reward
    model logs the gold reward beside the proxy it optimises (``reward/model_mean``,
    ``reward/gold_mean``, ``reward/gold_accuracy``): over-optimisation shows as the two parting.
    """

    def __init__(self, checker, source: str = "checker", model_weight: float = 0.5, model_scores=None,
                 random_rate: float = 0.5, seed: int = 0):  # fmt: skip
        if source in ("model", "mix") and model_scores is None:
            raise ValueError(f"reward source {source!r} needs a reward model")
        self.checker, self.source, self.model_weight, self.model_scores = checker, source, model_weight, model_scores
        self.random_rate, self.seed = random_rate, seed

    def __call__(self, batch: Batch) -> dict[str, float]:
        """Set ``batch.scores`` (the training reward) and ``batch.correct`` (the checker's verdict)."""
        metrics = outcome_metrics(score(batch, self.checker), "reward")
        if self.source == "checker":
            return metrics
        gold = batch.scores
        if self.source == "random":
            batch.scores = random_rewards(batch, self.random_rate, self.seed)
            return metrics | {"reward/random_mean": float(batch.scores.mean()), "reward/gold_mean": float(gold.mean()),
                              "reward/gold_accuracy": float(batch.correct.float().mean())}  # fmt: skip
        model = self.model_scores(batch)
        batch.scores = model if self.source == "model" else self.model_weight * model + (1 - self.model_weight) * gold
        return metrics | {"reward/model_mean": float(model.mean()), "reward/gold_mean": float(gold.mean()),
                          "reward/gold_accuracy": float(batch.correct.float().mean())}  # fmt: skip


def random_rewards(batch: Batch, rate: float, seed: int) -> torch.Tensor:
    """[B] 1.0 with probability ``rate``, else 0.0: one uniform draw per response from a hash of (run
    seed, row, prompt, response). Nothing about the answer's correctness enters, and the draw is a
    function of the batch alone, so a resumed or pipelined run pays the same rewards as an unbroken
    one (a stateful generator would restart on resume). The row enters so that identical responses
    in one group are drawn apart."""
    draws = []
    for row, (prompt, response) in enumerate(zip(batch.prompts, batch.responses)):
        digest = hashlib.blake2b(f"{seed}\0{row}\0{prompt}\0{response}".encode(), digest_size=8).digest()
        draws.append(int.from_bytes(digest, "little") / 2.0**64)  # uniform in [0, 1)
    return (torch.tensor(draws, dtype=torch.float64) < rate).to(torch.float32)


def outcome_metrics(verdicts: list, prefix: str) -> dict[str, float]:
    """Fractions of verdicts the checker could not grade as right or wrong: ``{prefix}/no_answer_frac``,
    ``{prefix}/timeout_frac``, ``{prefix}/error_frac`` (a rising no-answer fraction is a format
    problem, not a maths one; timeouts and errors point at the checker)."""
    kinds = [v.outcome for v in verdicts]
    n = max(len(kinds), 1)
    return {f"{prefix}/{kind}_frac": kinds.count(kind) / n for kind in ("no_answer", "timeout", "error")}


def generate_and_score(generator: Generator, examples: list[Example], checker, n: int = 1, temperature: float = 0.0,
                       *, chunk_prompts: int, max_tokens: int,
                       progress: Progress | None = None) -> list[tuple[Batch, list]]:  # fmt: skip
    """Generate ``n`` responses per example and score them; one (batch, verdicts) per chunk, in order.

    Prompts go in chunks of ``chunk_prompts // n`` (at least 1), so a chunk holds about as
    many sequences whatever ``n`` (padding, and so float rounding, depends on the chunk:
    keep the chunking equal and the numbers are equal). Nothing counts against the
    training budget.
    """
    chunk = max(1, int(chunk_prompts) // n)
    task = progress.add_task("eval", total=len(examples)) if progress is not None else None
    out = []
    for start in range(0, len(examples), chunk):
        part = examples[start : start + chunk]
        batch = generator.rollout(part, n=n, temperature=temperature, count=False, max_tokens=max_tokens)
        if int(batch.group_ids.max()) + 1 != len(part):
            raise RuntimeError(f"the rollout returned {int(batch.group_ids.max()) + 1} prompts' responses for {len(part)}")
        out.append((batch, score(batch, checker)))
        if task is not None:
            progress.advance(task, len(part))
    return out


def eval_settings(rollout_cfg: RolloutConfig) -> dict[str, int]:
    """Chunking and length cap of every eval: ``rollout.eval_batch_prompts`` and the eval cap
    (``rollout.eval_max_response_tokens``, else the training one)."""
    return {"chunk_prompts": int(rollout_cfg.eval_batch_prompts),
            "max_tokens": int(rollout_cfg.eval_max_response_tokens or rollout_cfg.max_response_tokens)}


def accuracy_metrics(scored: list[tuple[Batch, list]], task_name: str) -> dict[str, float]:
    """Accuracy and mean response length (tokens) of temperature-0 responses, one per example."""
    correct = torch.cat([b.correct for b, _ in scored])
    lengths = torch.cat([b.response_mask.sum(-1) for b, _ in scored])
    # Counts over counts in Python floats: the same number `harness eval` computes.
    out = {f"eval/{task_name}/accuracy": int(correct.sum()) / len(correct),
           f"eval/{task_name}/response_tokens_mean": int(lengths.sum()) / len(lengths)}
    episodes = [b.episode for b, _ in scored if b.episode]
    if episodes:  # an environment's episodes: eval/<task>/turns_mean, tool_calls_mean, ...
        merged = {k: torch.cat([e[k] for e in episodes]) for k in ("turns", "tool_calls", "tool_errors")}
        out |= episode_metrics({**merged, "end": [r for e in episodes for r in e["end"]]}, f"eval/{task_name}")
    return out


def eval_policy(engine: Generator, examples: list[Example], checker, task_name: str) -> dict[str, float]:
    """The in-training eval: accuracy of the policy's temperature-0 responses on ``examples``."""
    scored = generate_and_score(engine, examples, checker, **eval_settings(engine.settings.rollout))
    return accuracy_metrics(scored, task_name)


class ModelGenerator:
    """An in-memory HF causal LM behind the engine's ``rollout`` (the warm start checks the
    model it is fine-tuning, which no engine holds). Prompts rendered without a chat template."""

    def __init__(self, model, tokenizer):
        from harness.runtime.rollout.hf import HFRollout  # transformers: only when a model is at hand

        self.backend = HFRollout(model, tokenizer)
        self.tokenizer = tokenizer

    def rollout(self, examples: list[Example], n: int, temperature: float | None = 0.0, count: bool = False,
                max_tokens: int | None = None) -> Batch:  # fmt: skip
        from harness.runtime.rollout.base import decode_responses

        prompts = [render_prompt(ex.messages, self.tokenizer, False) for ex in examples]
        gen = self.backend.generate(prompts, n=n, max_new_tokens=max_tokens, temperature=temperature or 0.0)
        rows = gen.group_ids.tolist()
        return Batch(
            prompt_ids=gen.prompt_ids, prompt_mask=gen.prompt_mask, response_ids=gen.response_ids,
            response_mask=gen.response_mask, group_ids=gen.group_ids, prompts=[prompts[i] for i in rows],
            responses=decode_responses(self.tokenizer, gen.response_ids, gen.response_mask),
            ground_truths=[examples[i].ground_truth for i in rows], truncated=gen.truncated,
            max_response_tokens=int(max_tokens or 0),
        )
