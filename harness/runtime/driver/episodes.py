"""Multi-turn episodes: the model and an environment take turns (``env.name``, issue #17).

An episode is one row of the batch. Its prompt is the environment's first messages
(``Environment.reset``), rendered like any prompt; its *response span* is everything after the
prompt, in the order it happened: the model's first turn, the environment's observation, the
model's next turn, ... Token ids are kept as generated and as tokenized, never re-tokenized from
text, so the trainer's forward over the span reads exactly what the rollout engine read.

Masks (``algorithms.Batch``): ``response_mask`` is True on the model's tokens only, so every loss,
KL and entropy term and every token count sees the model's tokens and nothing else, with no change
to any algorithm (their advantages are per episode: the checker scores the final answer; GAE and
discounted returns skip masked positions). ``context_mask`` is True on every real token of the
span: attention and position ids follow it.

Turn 1 is the very generate call a single-turn rollout makes (same prompts, seeds and cap), so an
environment that ends every episode after one turn reproduces a single-turn run exactly. Later
turns continue each live episode from its token ids, one sample each, all live episodes in one
call per turn (sharded over the workers like any rollout).

Limits: ``env.max_turns`` model turns (the environment's own count); ``rollout.max_response_tokens``
caps the whole span, model and environment tokens together (so batch widths stay bounded), and
``env.max_turn_tokens`` each model turn. End reasons: ``answered`` and ``max_turns`` (the
environment), ``max_tokens`` (the span is full: a turn cut at the cap, or an observation with no
room left for a model token after it), ``truncated`` (a turn hit ``env.max_turn_tokens`` without
its end-of-turn token; the episode stops there, since the environment cannot read half a turn).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from harness.data.envs import Environment
from harness.runtime.rollout.base import Generation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class Episode:
    env: Environment
    tokens: list[int] = field(default_factory=list)  # the response span: model and environment tokens
    trained: list[bool] = field(default_factory=list)  # True on the model's tokens
    logps: list[float] = field(default_factory=list)  # the rollout engine's log-probs (0 on environment tokens)
    turns: list[str] = field(default_factory=list)  # the model's turns, decoded
    tool_calls: int = 0
    tool_errors: int = 0
    end: str = ""
    truncated: bool = False  # the last model turn has no end-of-turn token

    @property
    def done(self) -> bool:
        return bool(self.end)


def observation_text(tokenizer: PreTrainedTokenizerBase, text: str, use_chat_template: bool, eos_texts: list[str] = ()) -> str:
    """What follows the model's end-of-turn token when ``text`` is the environment's answer.

    Without a chat template: the text itself. With one: what the template writes after the
    assistant's content when a user message holding ``text`` and the next assistant header follow
    it, less the end-of-turn token the model generated itself (one of ``eos_texts``, e.g.
    ``<|im_end|>``); so a newline the template puts after it belongs to the observation."""
    if not (use_chat_template and getattr(tokenizer, "chat_template", None)):
        return text
    marker = "\u2063"  # an invisible separator no template writes: where the assistant's content ends
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker},
                    {"role": "user", "content": text}]  # fmt: skip
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    tail = rendered[rendered.rindex(marker) + len(marker) :]
    for eos in sorted((e for e in eos_texts if e), key=len, reverse=True):
        if tail.startswith(eos):
            return tail[len(eos) :]
    return tail


def run_episodes(
    generate: Callable[[list, int, int, list[int] | None], Generation],
    decode: Callable[[list[int]], str],
    encode: Callable[[str, int], list[int]],
    first: Generation,
    envs: list[Environment],
    eos_ids: list[int],
    max_span_tokens: int,
    max_turn_tokens: int,
    seeds: Callable[[int], list[int] | None],
    max_turns: int = 0,
) -> list[Episode]:
    """Play every episode to its end; ``first`` is turn 1 (one row per episode, in order).

    ``generate(contexts, n, max_tokens, seeds)``: one sample per token-id context. ``encode(text,
    eos_id)``: an observation's text to token ids, wrapped (``observation_text``) after the
    end-of-turn token ``eos_id`` the model wrote. ``seeds(k)``:
    per-request seeds for a call of k contexts (None: the backend's own RNG). ``max_turns`` (> 0):
    the loop's own turn limit, whatever the environment does with its own."""
    episodes = [Episode(env) for env in envs]
    prompts = [ids[m].tolist() for ids, m in zip(first.prompt_ids, first.prompt_mask)]
    live = list(range(len(episodes)))
    gen, turn_cap = first, max_turn_tokens
    while live:
        for row, i in enumerate(live):  # the model's turn
            ep = episodes[i]
            room = max_span_tokens - len(ep.tokens)
            ids = gen.response_ids[row][gen.response_mask[row]].tolist()[:room]
            lp = gen.rollout_logp[row][gen.response_mask[row]].tolist()[:room] if gen.rollout_logp is not None else [0.0] * len(ids)
            ep.tokens += ids
            ep.trained += [True] * len(ids)
            ep.logps += lp
            ep.turns.append(decode(ids))
            if not ids or ids[-1] not in eos_ids:  # cut off: the environment cannot read half a turn
                ep.truncated = True
                ep.end = "max_tokens" if len(ep.tokens) >= max_span_tokens else "truncated"
                continue
            turn = ep.env.step(ep.turns[-1])  # the environment's answer
            ep.tool_calls += int(turn.info.get("tool_calls", 0))
            ep.tool_errors += int(turn.info.get("tool_errors", 0))
            if turn.done:
                ep.end = turn.end_reason or "answered"
                continue
            if max_turns and len(ep.turns) >= max_turns:  # no turn left to read the observation
                ep.end = "max_turns"
                continue
            obs = encode(turn.observation or "", ep.tokens[-1])  # the end-of-turn token the model wrote
            if len(ep.tokens) + len(obs) >= max_span_tokens:  # no room left for the model to read it and go on
                ep.end = "max_tokens"
                continue
            ep.tokens += obs
            ep.trained += [False] * len(obs)
            ep.logps += [0.0] * len(obs)
        live = [i for i in live if not episodes[i].done]
        if not live:
            break
        contexts = [prompts[i] + episodes[i].tokens for i in live]
        # One call for all live episodes, capped by the largest room; each turn is then cut to its own
        # episode's room (a prefix of a sample is what a shorter cap would have sampled).
        room = max(max_span_tokens - len(episodes[i].tokens) for i in live)
        cap = min(turn_cap, room) if turn_cap else room
        gen = generate(contexts, 1, cap, seeds(len(live)))
    return episodes


def episode_tensors(episodes: list[Episode], pad_id: int) -> dict[str, Any]:
    """Right-padded [B, T] response ids, the model-token mask, the context mask and log-probs."""
    width = max(1, max(len(ep.tokens) for ep in episodes))
    ids = torch.full((len(episodes), width), pad_id, dtype=torch.long)
    trained = torch.zeros((len(episodes), width), dtype=torch.bool)
    context = torch.zeros((len(episodes), width), dtype=torch.bool)
    logp = torch.zeros((len(episodes), width), dtype=torch.float32)
    for i, ep in enumerate(episodes):
        n = len(ep.tokens)
        if n:
            ids[i, :n] = torch.tensor(ep.tokens)
            trained[i, :n] = torch.tensor(ep.trained)
            context[i, :n] = True
            logp[i, :n] = torch.tensor(ep.logps)
    return {"response_ids": ids, "response_mask": trained, "context_mask": context, "rollout_logp": logp}


def episode_metrics(episode: dict[str, Any] | None, prefix: str = "env") -> dict[str, float]:
    """``env/turns_mean``, ``env/tool_calls_mean``, ``env/tool_error_frac`` (errors per call) and
    ``env/end_<reason>_frac`` of a batch's episodes (empty without an environment)."""
    if not episode:
        return {}
    n = max(len(episode["end"]), 1)
    calls = float(episode["tool_calls"].sum())
    out = {
        f"{prefix}/turns_mean": float(episode["turns"].float().mean()),
        f"{prefix}/tool_calls_mean": calls / n,
        f"{prefix}/tool_error_frac": float(episode["tool_errors"].sum()) / calls if calls else 0.0,
        f"{prefix}/tool_success_frac": float((episode["tool_calls"] > episode["tool_errors"]).float().mean()),
    }
    for reason in ("answered", "max_turns", "max_tokens", "truncated"):
        out[f"{prefix}/end_{reason}_frac"] = episode["end"].count(reason) / n
    return out
