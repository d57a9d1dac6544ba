"""The two sides of bench/bench_trl.py, each run in its own process, and the shared model.

    python bench/trl_sides.py build MODEL_DIR [SFT_MAX_STEPS]
    python bench/trl_sides.py harness|harness-bf16|trl MODEL_DIR STEPS OUT_JSON [GO_FD DONE_FD]

``build`` makes the benchmark model offline: a Qwen2-architecture causal LM (hidden 256,
5 layers, 4 heads / 2 KV heads, MLP 1024, vocab 1024, fp32, tied embeddings) with the
harness's digit-level BPE tokenizer trained on the arith task (14 tokens) padded with
filler tokens to a vocabulary of 1024, warm-started with a short SFT on arith (the
harness's recipe: until 10% greedy accuracy on held-out train prompts) so rollouts end
with EOS at mixed lengths and rewards are mixed (non-zero advantages).

A side runs STEPS GRPO steps from that model. With GO_FD/DONE_FD (pipes from the parent)
it stops at every step end, writes a line to DONE_FD and waits for a line on GO_FD, so
the parent can run the sides' steps in turn (lockstep). It writes, per step, the wall time
from its go to its step end (everything the loop does per step: rollout, scoring, batch
preparation, update, weight sync, logging) and the split:

    rollout   harness: engine.rollout (render, tokenize, generate, decode)
              TRL: GRPOTrainer._generate (tokenize, generate, decode)
    scoring   the arith checker on both sides (harness: score(); TRL: _calculate_rewards)
    logp      harness: select + annotate (old/ref log-probs when needed; none here)
              TRL: the rest of _prepare_inputs (padding, old log-probs when needed, advantages)
    update    the rest of the step: forward/backward, optimizer step (+ harness weight sync)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

MODEL = dict(hidden_size=256, num_layers=5, num_heads=4, num_kv_heads=2, intermediate_size=1024, vocab_size=1024)
MODEL_VERSION = 1  # bump when build() changes (the model is cached by this)
PROMPTS_PER_STEP, SAMPLES_PER_PROMPT, MAX_RESPONSE_TOKENS = 16, 8, 16
TEMPERATURE, TOP_P, LR, BETAS, GRAD_CLIP, ADV_EPS, SEED = 1.0, 1.0, 1e-5, (0.9, 0.99), 1.0, 1e-4, 0


# ------------------------------------------------------------------------- model
def build(out_dir: str, sft_max_steps: int = 400) -> None:
    """The benchmark model (see the module docstring), saved to ``out_dir``."""
    import random

    from harness.config import TaskConfig
    from harness.data.tasks import load_task, render_prompt
    from harness.models import _holdout_accuracy, new_qwen2, sft_target, train_tokenizer
    from rewards import get as get_checker

    random.seed(SEED)
    torch.manual_seed(SEED)
    task = load_task(TaskConfig())
    texts = [render_prompt(ex.messages, None, False) + sft_target(task.name, ex.ground_truth) for ex in task.train]
    tok = train_tokenizer(texts, MODEL["vocab_size"])
    tok.add_tokens([f"<|fill{i}|>" for i in range(MODEL["vocab_size"] - len(tok))])
    model = new_qwen2(tok, MODEL["hidden_size"], MODEL["intermediate_size"], MODEL["num_layers"], MODEL["num_heads"],
                      MODEL["num_kv_heads"], max_positions=256)  # fmt: skip
    checker = get_checker(task.checker)
    holdout, pool = task.train[-128:], task.train[:-128]
    rows = []
    for ex in pool:
        p = tok(render_prompt(ex.messages, None, False), add_special_tokens=False)["input_ids"]
        r = tok(sft_target(task.name, ex.ground_truth), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((p, r))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    rng, step, accuracy = random.Random(SEED), 0, 0.0
    while accuracy < 0.10 and step < sft_max_steps:
        batch = [rows[rng.randrange(len(rows))] for _ in range(64)]
        width = max(len(p) + len(r) for p, r in batch)
        ids = torch.full((64, width), tok.eos_token_id)
        labels = torch.full((64, width), -100)
        mask = torch.zeros((64, width), dtype=torch.long)
        for i, (p, r) in enumerate(batch):
            ids[i, : len(p) + len(r)] = torch.tensor(p + r)
            labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
            mask[i, : len(p) + len(r)] = 1
        model.train()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % 25 == 0:
            accuracy = _holdout_accuracy(model, tok, holdout, checker, task.name, MAX_RESPONSE_TOKENS)
    tmp = Path(f"{out_dir}.tmp{os.getpid()}")
    model.eval().save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    params = sum(p.numel() for p in model.parameters())
    (tmp / "bench_model.json").write_text(json.dumps({"params": params, "sft_steps": step, "holdout_accuracy": accuracy,
                                                       "version": MODEL_VERSION, **MODEL}))
    tmp.rename(out_dir)


# ----------------------------------------------------------------- shared config
def harness_overrides(model_dir: str, steps: int, precision: str) -> list[str]:
    """The harness run the benchmark times (also the TRL side's prompt source)."""
    return [
        f"model.path={model_dir}", "algo=grpo", "algo.kl_coef=0", f"algo.eps={ADV_EPS}",
        f"algo.samples_per_prompt={SAMPLES_PER_PROMPT}", "algo.loss_agg=seq_mean_token_mean",
        "algo.clip_low=0.2", "algo.clip_high=0.2", "algo.epochs=1",
        f"trainer.prompts_per_step={PROMPTS_PER_STEP}", "trainer.sequences_per_minibatch=0",
        f"trainer.micro_batch_sequences={PROMPTS_PER_STEP * SAMPLES_PER_PROMPT}",
        f"trainer.lr={LR}", f"trainer.betas=[{BETAS[0]},{BETAS[1]}]", f"trainer.grad_clip={GRAD_CLIP}",
        "trainer.weight_decay=0", "trainer.warmup_steps=0", f"trainer.precision={precision}",
        f"trainer.steps={steps}", f"trainer.eval_every={steps}", "trainer.checkpoint_every=0",
        f"rollout.max_response_tokens={MAX_RESPONSE_TOKENS}", f"rollout.temperature={TEMPERATURE}",
        f"rollout.top_p={TOP_P}", "task.eval_prompts=16", f"seed={SEED}",
    ]


def compose(overrides: list[str]):
    from harness.config import compose_config

    return compose_config(overrides)


class Gate:
    """Step boundaries: the time of each step end and of each go that follows it.

    With pipes from the parent, ``step_end`` reports the end and blocks until the
    parent says go; without, it just records the time (go = end).
    """

    def __init__(self, go_fd: int | None = None, done_fd: int | None = None):
        self.go = os.fdopen(go_fd, "r") if go_fd is not None else None
        self.done = os.fdopen(done_fd, "w", buffering=1) if done_fd is not None else None
        self.ends: list[float] = []
        self.gos: list[float] = []

    def step_end(self) -> None:
        self.ends.append(time.perf_counter())
        if self.done is not None:
            self.done.write("done\n")
            self.done.flush()
            self.go.readline()
        self.gos.append(time.perf_counter())

    def step_seconds(self) -> list[float]:
        """Per step: its end minus the go after the previous end (the first end is the ready point)."""
        return [end - go for go, end in zip(self.gos, self.ends[1:])]


# ------------------------------------------------------------------------ harness
def run_harness(model_dir: str, steps: int, precision: str, gate: Gate) -> list[dict]:
    from rich.console import Console

    import harness.trainer as trainer
    from harness.rundir.writer import RunDir

    log = RunDir.log

    def log_then_gate(self, metrics):  # one call per step (and one for the step-0 eval), after the step's work
        out = log(self, metrics)
        gate.step_end()
        return out

    RunDir.log = log_then_gate
    with tempfile.TemporaryDirectory() as run_dir:
        trainer.train(compose(harness_overrides(model_dir, steps, precision)), run_dir, console=Console(quiet=True))
        rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))][1:]
    return [
        {"step_s": dt, "rollout_s": r["perf/rollout_s"], "scoring_s": r["perf/score_s"], "logp_s": r["perf/logp_s"],
         "tokens": r["rollout/generated_tokens"], "reward": r["reward/mean"]}
        for dt, r in zip(gate.step_seconds(), rows)
    ]


# ---------------------------------------------------------------------------- TRL
def prompt_schedule(model_dir: str, steps: int) -> list[dict]:
    """The harness's prompts, step by step, rendered as the harness renders them."""
    from harness.data.tasks import load_task, render_prompt
    from harness.models import load_tokenizer
    from harness.trainer import PromptStream

    cfg = compose(harness_overrides(model_dir, steps, "fp32"))
    tok = load_tokenizer(model_dir)
    stream = PromptStream(load_task(cfg.task).train, PROMPTS_PER_STEP, SEED)
    rows = []
    for _ in range(steps):
        for ex in stream.next():
            rows.append({"prompt": render_prompt(ex.messages, tok, cfg.task.use_chat_template),
                         "ground_truth": ex.ground_truth})
    return rows


def run_trl(model_dir: str, steps: int, gate: Gate) -> list[dict]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import rewards

    checker = rewards.get("arith")
    timers: dict[str, float] = {"rollout_s": 0.0, "scoring_s": 0.0, "prepare_s": 0.0}
    rows: list[dict] = []

    def arith_reward(prompts, completions, ground_truth, **_):
        return [v.score for v in checker.score_batch(completions, ground_truth)]

    class Timed(GRPOTrainer):  # adds timers around TRL's own methods, changes nothing
        def _timed(self, key, fn, *args):
            t0 = time.perf_counter()
            out = fn(*args)
            timers[key] += time.perf_counter() - t0
            return out

        def _generate(self, prompts):
            out = self._timed("rollout_s", super()._generate, prompts)
            timers["tokens"] = sum(len(c) for c in out[1])
            return out

        def _calculate_rewards(self, *args):
            out = self._timed("scoring_s", super()._calculate_rewards, *args)
            timers["reward"] = float(out.mean())
            return out

        def _prepare_inputs(self, batch):
            return self._timed("prepare_s", super()._prepare_inputs, batch)

    class StepEnds(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            gate.step_end()  # ready: the model is loaded, the first step starts on go

        def on_step_end(self, args, state, control, **kw):
            gate.step_end()
            t = dict(timers)
            rows.append({"rollout_s": t["rollout_s"], "scoring_s": t["scoring_s"],
                         "logp_s": t["prepare_s"] - t["rollout_s"] - t["scoring_s"], "tokens": t.get("tokens"),
                         "reward": t.get("reward")})
            timers.update(rollout_s=0.0, scoring_s=0.0, prepare_s=0.0)

    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir, use_cpu=True, seed=SEED, bf16=False, fp16=False, gradient_checkpointing=False,
            per_device_train_batch_size=PROMPTS_PER_STEP * SAMPLES_PER_PROMPT, gradient_accumulation_steps=1,
            num_generations=SAMPLES_PER_PROMPT, max_completion_length=MAX_RESPONSE_TOKENS, temperature=TEMPERATURE,
            top_p=TOP_P, top_k=0, beta=0.0, num_iterations=1, epsilon=0.2, loss_type="grpo", scale_rewards="group",
            learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=BETAS[0], adam_beta2=BETAS[1],
            weight_decay=0.0, max_grad_norm=GRAD_CLIP, optim="adamw_torch", max_steps=steps, logging_steps=1,
            save_strategy="no", eval_strategy="no", report_to="none", disable_tqdm=True, shuffle_dataset=False,
            dataloader_num_workers=0, log_completions=False,
        )
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        trainer = Timed(
            model=model, reward_funcs=[arith_reward], args=args,
            train_dataset=Dataset.from_list(prompt_schedule(model_dir, steps)),
            processing_class=AutoTokenizer.from_pretrained(model_dir), callbacks=[StepEnds()],
        )
        trainer.train()
    return [{"step_s": dt, **row} for dt, row in zip(gate.step_seconds(), rows)]


def main(argv: list[str]) -> None:
    if argv[0] == "build":
        build(argv[1], *map(int, argv[2:3]))
        return
    side, model_dir, steps, out = argv[0], argv[1], int(argv[2]), argv[3]
    gate = Gate(*map(int, argv[4:6])) if len(argv) >= 6 else Gate()
    if side == "trl":
        rows = run_trl(model_dir, steps, gate)
    else:
        rows = run_harness(model_dir, steps, "bf16" if side == "harness-bf16" else "fp32", gate)
    Path(out).write_text(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
