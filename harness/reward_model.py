"""``harness rm train``: a Bradley-Terry reward model trained on preference pairs.

    harness rm train                                    # tiny model, arith pairs built offline
    harness rm train rm.train_pairs=pairs.parquet rm.eval_pairs=held_out.parquet model.path=...

Model: the policy architecture's transformer body with a scalar head (``ValueModel``, zero
initialised, FSDP2 like every other model in the runtime), started from ``model.path``. The
reward of a response is the head's output on its last token (an end-of-sequence token is
appended, so the score has read the whole response). Loss (Bradley-Terry; Ouyang et al. 2022,
arXiv:2203.02155, eq. 1): -log sigma(r(x, y_chosen) - r(x, y_rejected)), averaged over the
pairs of a step; AdamW with the trainer's settings, ``rm.lr`` decayed linearly to 0. A constant added to every reward leaves the loss unchanged, so the head's
bias is frozen at 0 (its gradient is zero up to rounding, which Adam would amplify) and the
export below, whose score head has no bias, is exact.

Data (harness/data/pairs.py): ``arith`` builds right-vs-wrong pairs from the arith task's train
split (held out: its test split), or a jsonl/parquet file in the (prompt, chosen, rejected)
schema. The run directory holds config.yaml, metrics.jsonl (``rm/loss``,
``rm/pair_accuracy`` of the step's pairs; ``eval/pair_accuracy`` and ``eval/margin`` on the
held-out pairs), run.json and ``reward_model/``: a Hugging Face
``AutoModelForSequenceClassification`` directory (one label; it scores the last non-pad token,
the same token as here) with the tokenizer.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from rich.console import Console

import rewards
from algorithms import Batch
from harness.config import Config, runtime_settings, task_presets
from harness.core.errors import ModelError
from harness.data.pairs import Pair, arith_pairs, load_pairs
from harness.data.tasks import load_task, render_prompt
from harness.models import (
    cached_build,
    check_same_vocab,
    load_causal_lm,
    load_tokenizer,
    resolve_model,
    weights_sha256,
)
from harness.rundir.writer import RunDir
from harness.runtime.rollout.base import encode_prompts
from harness.runtime.train.fsdp import TrainEngine, ValueModel, init_distributed
from harness.runtime.workers.worker import resolve_device
from harness.scoring import ModelGenerator, generate_and_score

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def pairs_from(source: str, split: str, seed: int, policy: torch.nn.Module | None = None) -> list[Pair]:
    """``arith``: offline right-vs-wrong answers; ``arith_samples``: the starting policy's own right
    and wrong samples (``policy`` = (model, tokenizer, cfg)); else a jsonl/parquet pairs file.
    Several sources joined with ``+`` are concatenated."""
    if "+" in source:
        return [pair for part in source.split("+") for pair in pairs_from(part, split, seed, policy)]
    if source == "arith":
        return arith_pairs(task_presets()["arith"], split, seed)
    if source == "arith_samples":
        return sample_pairs(*policy, split=split, seed=seed)
    return load_pairs(source)


def sample_pairs(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, cfg: Config, split: str, seed: int, samples: int = 8,
                 pairs_per_prompt: int = 4) -> list[Pair]:  # fmt: skip
    """Right vs wrong responses of the starting policy itself, ``samples`` per arith prompt at
    temperature 1, up to ``pairs_per_prompt`` (right, wrong) pairs of distinct responses per prompt:
    the data of InstructGPT's reward model (Ouyang et al. 2022, arXiv:2203.02155), the SFT
    policy's samples ranked (here by the checker). Measured on arith (docs/reward_models.md): a
    reward model on these pairs alone (0.926 held-out pair accuracy) was exploited by GRPO as one
    on units-only offsets was; the default ``arith`` pairs (offsets in every digit) were not."""
    task = load_task(task_presets()["arith"])
    examples = task.train if split == "train" else task.test
    checker = rewards.get("arith")
    torch.manual_seed(seed)
    generator = ModelGenerator(model, tokenizer)
    scored = generate_and_score(generator, examples, checker, n=samples, temperature=1.0, chunk_prompts=1024,
                                max_tokens=cfg.rollout.max_response_tokens)  # fmt: skip
    out, start, rng = [], 0, random.Random(seed)
    for batch, _ in scored:
        groups = int(batch.group_ids.max()) + 1
        for g in range(groups):
            rows = (batch.group_ids == g).nonzero()[:, 0].tolist()
            right = sorted({batch.responses[i] for i in rows if batch.correct[i]})
            wrong = sorted({batch.responses[i] for i in rows if not batch.correct[i] and batch.responses[i].strip()})
            rng.shuffle(wrong)
            for i, rejected in enumerate(wrong[: pairs_per_prompt if right else 0]):
                out.append(Pair(examples[start + g].messages, right[i % len(right)], rejected))
        start += groups
    return out


def pair_batch(pairs: list[Pair], tokenizer: PreTrainedTokenizerBase, use_chat_template: bool, max_prompt_tokens: int,
               max_response_tokens: int) -> Batch:  # fmt: skip
    """Chosen responses in rows 0..n-1, rejected in n..2n-1, each ending in EOS."""
    prompts = [render_prompt(p.prompt, tokenizer, use_chat_template) for p in pairs] * 2
    responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, max_prompt_tokens)
    eos = tokenizer.eos_token_id
    ids = [tokenizer(r, add_special_tokens=False)["input_ids"][: max_response_tokens - 1] + [eos] for r in responses]
    width = max(len(x) for x in ids)
    response_ids = torch.full((len(ids), width), eos, dtype=torch.long)
    response_mask = torch.zeros((len(ids), width), dtype=torch.bool)
    for i, x in enumerate(ids):
        response_ids[i, : len(x)] = torch.tensor(x)
        response_mask[i, : len(x)] = True
    n = len(responses)
    return Batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
                 group_ids=torch.arange(n) % len(pairs), prompts=prompts, responses=responses, ground_truths=[""] * n,
                 truncated=torch.zeros(n, dtype=torch.bool))  # fmt: skip


def rewards_of(engine: TrainEngine, batch: Batch) -> torch.Tensor:
    """[2n] the head's output at each response's EOS (the state after its last real token)."""
    values, _ = engine.forward(batch)
    last = batch.response_mask.long().sum(-1) - 1
    return values.gather(1, last.to(values.device)[:, None])[:, 0].float()


def bt_loss(rewards: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry loss of [chosen..., rejected...] rewards, and the pairs' accuracy and margin."""
    chosen, rejected = rewards.chunk(2)
    margin = chosen - rejected
    loss = -F.logsigmoid(margin).mean()
    margin = margin.detach()
    return loss, {"pair_accuracy": float((margin > 0).float().mean()), "margin": float(margin.mean())}


def train_reward_model(cfg: Config, run_dir: str, console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    rm = cfg.rm
    if cfg.runtime.threads > 0:
        torch.set_num_threads(cfg.runtime.threads)
    with RunDir(run_dir, cfg) as run:
        task = load_task(cfg.task)  # the tiny model's warm start is built from it (when not shipped)
        model_path, model_info = resolve_model(cfg.model, task, rewards.get(cfg.task.checker),
                                               cfg.rollout.max_response_tokens, console)  # fmt: skip
        tokenizer = load_tokenizer(model_path, cfg.model.trust_remote_code)
        device = resolve_device(cfg.runtime.device)
        init_distributed(device)
        lm = load_causal_lm(model_path, cfg.model.dtype, cfg.model.trust_remote_code)
        if "arith_samples" in (rm.train_pairs, rm.eval_pairs):
            console.print("sampling the starting policy for arith_samples pairs ...")
        policy = (lm.eval(), tokenizer, cfg)
        train_pairs = pairs_from(rm.train_pairs, "train", cfg.seed, policy)
        eval_pairs = pairs_from(rm.eval_pairs, "test", cfg.seed, policy)
        lm.train()
        torch.manual_seed(cfg.seed)
        optim = dataclasses.replace(runtime_settings(cfg).trainer, lr=rm.lr)  # the run's AdamW settings, the RM's learning rate
        head = ValueModel(lm.model, lm.config.hidden_size)
        head.value_head.bias.requires_grad_(False)  # a shared offset: no signal in a pair (see the docstring)
        engine = TrainEngine(head, device, cfg.trainer.precision, optim)
        run.start(cfg, "bradley-terry", model_info)
        run.write_info(kind="reward_model", model_path=model_path, train_pairs=len(train_pairs), eval_pairs=len(eval_pairs))
        run.truncate_metrics(-1)

        def batch_of(pairs):
            return pair_batch(pairs, tokenizer, cfg.task.use_chat_template, cfg.task.max_prompt_tokens,
                              cfg.rollout.max_response_tokens)  # fmt: skip

        def evaluate() -> dict[str, float]:
            engine.model.eval()
            with torch.no_grad():
                rewards = [rewards_of(engine, batch_of(eval_pairs[i : i + 128])) for i in range(0, len(eval_pairs), 128)]
            engine.model.train()
            margins = torch.cat([r.chunk(2)[0] - r.chunk(2)[1] for r in rewards])
            return {"eval/pair_accuracy": float((margins > 0).float().mean()), "eval/margin": float(margins.mean())}

        rng, t0 = random.Random(cfg.seed), time.perf_counter()
        first = {"step": 0, **evaluate()}
        run.log(first)
        last = first
        for step in range(1, rm.steps + 1):
            for group in engine.optimizer.param_groups:  # linear decay to 0: the last steps settle the ranking
                group["lr"] = rm.lr * (1 - (step - 1) / rm.steps)
            pairs = [train_pairs[rng.randrange(len(train_pairs))] for _ in range(rm.pairs_per_step)]
            loss, stats = bt_loss(rewards_of(engine, batch_of(pairs)))
            loss.backward()
            grad_norm = engine.optimizer_step()
            metrics = {"step": step, "rm/loss": float(loss.detach()), "rm/pair_accuracy": stats["pair_accuracy"],
                       "rm/margin": stats["margin"], "rm/grad_norm": grad_norm, "perf/wall_s": time.perf_counter() - t0}  # fmt: skip
            if step % rm.eval_every == 0 or step == rm.steps:
                metrics |= evaluate()
                console.print(f"step {step}: loss {metrics['rm/loss']:.4f}, held-out pair accuracy "
                              f"{metrics['eval/pair_accuracy']:.3f}")  # fmt: skip
            run.log(metrics)
            last = metrics
        out = export(engine, lm, tokenizer, run.path / "reward_model")
        wall = time.perf_counter() - t0
        run.write_info(status="finished", steps_done=rm.steps, wall_s=round(wall, 2), eval_first=first["eval/pair_accuracy"],
                       eval_final=last["eval/pair_accuracy"], eval_metric="eval/pair_accuracy",
                       reward_model=str(out), reward_model_sha256=weights_sha256(out))  # fmt: skip
        console.print(f"[bold green]done[/]: held-out pair accuracy {first['eval/pair_accuracy']:.3f} -> "
                      f"{last['eval/pair_accuracy']:.3f} in {wall:.0f} s; reward model in {out}")  # fmt: skip
        return run.info


def export(engine: TrainEngine, lm: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> str | Path:
    """The trained body + head as an ``AutoModelForSequenceClassification`` directory (one label)."""
    from transformers import AutoModelForSequenceClassification

    state = engine.full_state_dict()
    config = lm.config.__class__.from_dict({**lm.config.to_dict(), "num_labels": 1, "pad_token_id": tokenizer.pad_token_id})
    model = AutoModelForSequenceClassification.from_config(config)
    body = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    missing, unexpected = model.model.load_state_dict(body, strict=False)
    if unexpected or missing:
        raise RuntimeError(f"reward model export: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        model.score.weight.copy_(state["value_head.weight"])
    if float(state["value_head.bias"].abs().max()) != 0.0:  # frozen at 0 in training
        raise RuntimeError("reward model export: the value head's bias moved; the exported model would differ")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def check_tokenizer(rm_path: str, policy_tokenizer: PreTrainedTokenizerBase, trust_remote_code: bool = False) -> None:
    """The runtime scores the policy's token ids: the reward model must read them as the policy does."""
    check_same_vocab(rm_path, policy_tokenizer, f"reward.model_path={rm_path}", "the reward model scores the "
                     "policy's token ids, so train it from the same base model", trust_remote_code)  # fmt: skip


def resolve_reward_model(cfg: Config, policy_info: dict, console: Console | None = None) -> tuple[str, dict]:
    """The reward model of ``reward.model_path``: an export directory as given, or ``tiny``:
    trained here with ``rm.*`` from ``model.path`` (seed 0, so every seed of a sweep shares one
    reward model), cached by the starting weights' SHA-256 and the rm settings; parallel runs
    train it once. Returns (path, info with its weights' SHA-256 and held-out pair accuracy)."""
    path = cfg.reward.model_path
    if path != "tiny":
        p = Path(path).expanduser()
        if not (p / "config.json").is_file():
            raise ModelError(f"reward.model_path={path}: not a model directory (no config.json); give the "
                             f"reward_model/ directory of a `harness rm train` run, or 'tiny'")  # fmt: skip
        return str(p), {"path": str(p), "weights_sha256": weights_sha256(p)}
    rm_settings = OmegaConf.to_container(cfg.rm, resolve=True)
    key = hashlib.sha256(json.dumps({"policy": policy_info.get("weights_sha256"), "rm": rm_settings,
                                     "model": cfg.model.path, "v": 2}, sort_keys=True).encode()).hexdigest()[:16]  # fmt: skip
    def build(tmp: Path) -> None:
        if console:
            console.print(f"[bold]Training the tiny reward model[/] (rm.*, cached as rm-{key}) ...")
        rm_cfg = copy.deepcopy(cfg)
        rm_cfg.seed = 0
        train_reward_model(rm_cfg, str(tmp), console)

    def finished(d: Path) -> bool:
        return (d / "run.json").exists() and json.loads((d / "run.json").read_text()).get("status") == "finished"

    target = cached_build(Path(os.path.expanduser(cfg.model.tiny.cache_dir)), f"rm-{key}", f"rm-{key}", build, finished)
    info = json.loads((target / "run.json").read_text())
    return str(target / "reward_model"), {"path": "tiny", "cache_key": key, "weights_sha256": info.get("reward_model_sha256"),
                                          "eval_pair_accuracy": info.get("eval_final")}  # fmt: skip
