"""Benchmark: the harness's GRPO step against TRL's GRPOTrainer at identical settings.

    python bench/bench_trl.py [--steps 12] [--reps 3] [--warmup 2] [--models warm,random]
                              [--threads N] [--write docs/performance.md]
    make bench-trl        # the defaults, writing docs/performance.md (needs the `bench` extra: trl)

Sides, each its own process (so peak RSS is per side), all started together and then run in
lockstep: one side's step at a time, every side paused at its step end until told to go, the
order rotating each step (A B C, B C A, ...). Steps of different sides thus alternate within
seconds and share the machine's state even when other work comes and goes; ``--reps`` rounds
of fresh processes.

    harness       harness.trainer.train (the real loop, engine and FSDP2 update), fp32
    harness-bf16  the same with trainer.precision=bf16 (autocast on CPU)
    trl           trl.GRPOTrainer, fp32

Matched on both sides (bench/trl_sides.py holds the values):
- model: one saved checkpoint (Qwen2 architecture, hidden 256, 5 layers, 4 heads / 2 KV heads,
  MLP 1024, vocab 1024, 5.2M params, fp32), built offline once (cached); the same tokenizer;
  dropout 0. Two models, each measured on its own: ``warm`` (a short SFT warm start on arith:
  responses end at EOS after a few tokens, rewards mixed) and ``random`` (random init: responses
  run to the 16-token cap, as in the issue's measurement).
- prompts: the harness's seeded prompt stream (arith task), 16 prompts per step, in the same
  order on both sides (TRL: dataset in that order, shuffle_dataset=False); 8 samples per prompt.
- sampling: temperature 1, top_p 1, top_k 0, at most 16 response tokens, stop at EOS, HF
  ``generate`` with KV cache on both sides.
- reward: the harness's arith checker, one call per batch.
- objective: GRPO advantage (r - group mean) / (group std + 1e-4), clipped surrogate with
  epsilon 0.2/0.2, no KL (beta 0, no reference model), loss aggregated per sequence (token mean)
  then over the 128 sequences (harness seq_mean_token_mean = TRL loss_type "grpo"), entropy
  computed on both sides (logged only).
- update: one optimizer step per batch (128 sequences in one micro-batch, no gradient
  accumulation, TRL num_iterations=1), AdamW(lr 1e-5, betas 0.9/0.99, weight decay 0),
  constant LR, grad-norm clip 1.0, no gradient checkpointing, fp32 (TRL bf16=False).
- per step both log metrics once (harness: metrics.jsonl line; TRL: logging_steps=1, no
  reporters, no tqdm); neither evaluates or saves inside the timed steps (TRL: eval and save
  off; the harness's step-0 and final evals and its final checkpoint fall outside the timed
  intervals, see below); a batch whose advantages are all zero still runs the update on both.

Timing: per step, the wall time from the side's go to its step end (the loop's per-step work,
including what it does between steps, e.g. logging); the first ``--warmup`` steps and the last
step (the harness's final eval) are dropped. Medians over all kept steps of all
reps. Peak RSS: ``ru_maxrss`` of each side's process (os.wait4), the max over its reps.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIDES = ("harness", "harness-bf16", "trl")
SPLIT = ("rollout_s", "scoring_s", "logp_s", "update_s")


# The benchmark models: name -> (SFT step cap when built, what it means for the step).
MODELS = {
    "warm": (400, "warm-started on arith: responses end at EOS after a few tokens, rewards are mixed"),
    "random": (0, "random init (no warm start): responses run to the 16-token cap, rewards are all 0 "
               "(zero advantages, the update still runs on both sides); the setting the issue measured"),
}


def model_dir(name: str) -> Path:
    from trl_sides import MODEL_VERSION

    cache = Path(os.path.expanduser(os.environ.get("HARNESS_CACHE", "~/.cache/harness")))
    return cache / "bench" / f"trl-compare-v{MODEL_VERSION}-{name}"


def ensure_model(path: Path, sft_steps: int) -> dict:
    """Build the benchmark model at ``path`` unless it is there; its build info."""
    if not (path / "bench_model.json").exists():
        print(f"building the benchmark model in {path} (once; a few minutes) ...", flush=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        build = [sys.executable, str(HERE / "trl_sides.py"), "build", str(path), str(sft_steps)]
        subprocess.run(build, env=child_env(), check=True)
    return json.loads((path / "bench_model.json").read_text())


def child_env(threads: int = 0) -> dict:
    env = dict(os.environ)
    if threads:  # e.g. 1 on a busy machine: no oversubscribed OpenMP spinning
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


class Side:
    """One side's process, paused at each step end until told to go (see trl_sides.Gate)."""

    def __init__(self, name: str, model: Path, steps: int, tmp: str, threads: int):
        self.name, self.out = name, Path(tmp) / f"{name}.json"
        go_r, self._go = os.pipe()
        self._done, done_w = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "trl_sides.py"), name, str(model), str(steps), str(self.out),
             str(go_r), str(done_w)],
            env=child_env(threads), stdout=subprocess.DEVNULL, pass_fds=(go_r, done_w),
        )
        os.close(go_r)
        os.close(done_w)

    def wait_step_end(self) -> None:
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(self._done, 1)
            if not chunk:
                raise SystemExit(f"side {self.name} exited early (exit code {self.proc.wait()})")
            line += chunk

    def go(self) -> None:
        os.write(self._go, b"go\n")

    def finish(self) -> tuple[list[dict], float]:
        """Its per-step rows and peak RSS in GiB, once it has exited."""
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        os.close(self._go)
        os.close(self._done)
        if self.proc.returncode:
            raise SystemExit(f"side {self.name} failed (exit code {self.proc.returncode})")
        return json.loads(self.out.read_text()), usage.ru_maxrss / 2**20  # KiB -> GiB


def run_round(names: list[str], model: Path, steps: int, threads: int) -> dict[str, tuple[list[dict], float]]:
    """All sides alive at once, their steps run one at a time in turn (order rotates each step)."""
    with tempfile.TemporaryDirectory() as tmp:
        sides = [Side(name, model, steps, tmp, threads) for name in names]
        try:
            for side in sides:
                side.wait_step_end()  # ready (set-up done, nothing timed yet)
            for step in range(steps):
                k = step % len(sides)
                for side in sides[k:] + sides[:k]:
                    side.go()
                    side.wait_step_end()
            for side in sides:
                side.go()  # let it finish (the harness saves its final checkpoint) and exit
            return {side.name: side.finish() for side in sides}
        finally:
            for side in sides:
                if side.proc.poll() is None:
                    side.proc.kill()


def summarise(rows: list[dict]) -> dict:
    for r in rows:
        r["update_s"] = r["step_s"] - r["rollout_s"] - r["scoring_s"] - r["logp_s"]
    keys = ("step_s", *SPLIT, "tokens", "reward")
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def machine() -> dict:
    info = {"cpu": platform.processor() or "?", "logical_cpus": os.cpu_count(), "flags": ""}
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                info["cpu"] = value.strip()
            if key.strip() == "flags":
                info["flags"] = " ".join(f for f in value.split() if f in ("avx512_bf16", "amx_bf16", "amx_tile"))
                break
        info["loadavg_before"] = Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        pass
    import torch
    import transformers
    import trl

    info |= {"python": platform.python_version(), "torch": torch.__version__,
             "transformers": transformers.__version__, "trl": trl.__version__, "threads": torch.get_num_threads()}
    return info


def measure(args, sides: list[str], model: Path) -> dict:
    """``--reps`` lockstep rounds on ``model``: per side its summary, peak RSS, per-rep medians."""
    rows = {s: [] for s in sides}
    per_rep = {s: [] for s in sides}
    rss = {s: 0.0 for s in sides}
    for rep in range(args.reps):
        for side, (steps, peak) in run_round(sides, model, args.steps, args.threads).items():
            kept = steps[args.warmup : -1]
            rows[side] += kept
            per_rep[side].append(statistics.median(r["step_s"] for r in kept))
            rss[side] = max(rss[side], peak)
            print(f"{model.name} rep {rep + 1}/{args.reps} {side:<13} median step {per_rep[side][-1] * 1e3:7.0f} ms, "
                  f"peak RSS {peak:.2f} GiB", flush=True)
    return {"results": {s: summarise(rows[s]) for s in sides}, "rss": rss, "per_rep": per_rep}


def table(run: dict) -> list[str]:
    results, rss, trl = run["results"], run["rss"], run["results"]["trl"]["step_s"]
    lines = [
        "| side | step (ms) | rollout | scoring | log-probs / prep | update | tokens/step | peak RSS (GiB) | step / TRL |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for side, r in results.items():
        lines.append(
            f"| {side} | {r['step_s'] * 1e3:.0f} | {r['rollout_s'] * 1e3:.0f} | {r['scoring_s'] * 1e3:.1f} | "
            f"{r['logp_s'] * 1e3:.1f} | {r['update_s'] * 1e3:.0f} | {r['tokens']:.0f} | {rss[side]:.2f} | "
            f"{r['step_s'] / trl:.2f} |"
        )
    lines += ["", "Per-rep median step (ms), in run order: " + "; ".join(
        f"{side} " + ", ".join(f"{v * 1e3:.0f}" for v in vals) for side, vals in run["per_rep"].items())]
    return lines


def render(cmd: str, info: dict, args, runs: dict) -> str:
    lines = [
        "# Performance: GRPO step, harness vs TRL",
        "",
        f"Generated by `{cmd}` (`make bench-trl` runs it with the defaults); do not edit by hand.",
        "What is matched between the sides is listed in the docstring of bench/bench_trl.py.",
        "",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {info['cpu']}, {info['logical_cpus']} logical CPUs, torch threads {info['threads']}, "
        f"bf16 flags: {info['flags'] or 'none'}, load average before the run: {info.get('loadavg_before', '?')}",
        f"- versions: python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
        f"trl {info['trl']}",
        "- step: 16 prompts x 8 samples, <= 16 response tokens, temperature 1, top_p 1, no KL, "
        "one optimizer step per batch, AdamW lr 1e-5, fp32 (harness-bf16: bf16 autocast)",
        f"- timing: median over {args.reps} reps x {args.steps - args.warmup - 1} steps per side "
        f"(first {args.warmup} steps and the last dropped); peak RSS of each side's process",
    ]
    for name, (build_info, about, run) in runs.items():
        lines += [
            "", f"## Model `{name}`", "",
            f"Qwen2 architecture, {build_info.get('params', 0) / 1e6:.1f}M params (hidden 256, 5 layers, 4 heads / "
            f"2 KV heads, MLP 1024, vocab 1024); {about} ({build_info.get('sft_steps')} SFT steps, greedy "
            f"held-out accuracy {build_info.get('holdout_accuracy', 0):.2f}).", "",
            *table(run),
        ]
    lines += ["", "## Notes", "",
              "Same settings and math on both sides; the harness differs in implementation only: each distinct "
              "prompt is prefilled once for its 8 samples in generation and run once per micro-batch in training "
              "(its KV cache serves its samples), responses are length-bucketed (each bucket padded to its own "
              "longest), no position is run whose output is never scored, old log-probs come from the update's "
              "own forward (one optimizer step per batch; TRL does the same), fused AdamW, and FSDP2 keeps the "
              "parameters unsharded between forward and backward on one rank.",
              "", "Split columns are medians of each part (ms), so they need not add up to the step median. "
              "rollout: tokenize + generate + decode; scoring: the arith checker; log-probs / prep: "
              "harness select + annotate (no extra forward here: one update per batch), TRL the rest of "
              "`_prepare_inputs` (padding, advantages); update: the rest of the step (forward/backward, "
              "optimizer step, harness weight sync, logging).", ""]
    return "\n".join(lines)


KEEP_MARKER = "<!-- sections below are written by other benches; bench_trl.py keeps them -->"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="GRPO steps per side per rep")
    parser.add_argument("--reps", type=int, default=3, help="rounds of fresh side processes")
    parser.add_argument("--warmup", type=int, default=2, help="leading steps dropped from each run")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated subset of " + ",".join(SIDES))
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--threads", type=int, default=0, help="torch threads per side (0: torch's default)")
    parser.add_argument("--model", default="", help="instead of --models: this model directory (built there "
                        "with --sft-steps if absent)")
    parser.add_argument("--sft-steps", type=int, default=400, help="with --model: warm-start cap when building")
    parser.add_argument("--write", default="", help="write the markdown report here (e.g. docs/performance.md)")
    args = parser.parse_args(argv)
    if args.steps < args.warmup + 2:
        parser.error("--steps must be at least --warmup + 2 (the last step is dropped too)")
    sides = [s for s in args.sides.split(",") if s]
    if "trl" not in sides or set(sides) - set(SIDES):
        parser.error(f"--sides: include trl and use only {', '.join(SIDES)}")
    models = [m for m in args.models.split(",") if m]
    if set(models) - set(MODELS) or not models:
        parser.error(f"--models: use {', '.join(MODELS)}")
    sys.path.insert(0, str(HERE))
    info = machine()
    if args.threads:
        info["threads"] = args.threads
    if args.model:
        plan = {"custom": (Path(args.model), args.sft_steps, f"built with at most {args.sft_steps} SFT steps")}
    else:
        plan = {m: (model_dir(m), MODELS[m][0], MODELS[m][1]) for m in models}
    runs = {}
    for name, (path, sft_steps, about) in plan.items():
        build_info = ensure_model(path, sft_steps)
        runs[name] = (build_info, about, measure(args, sides, path))
    cmd = "python bench/bench_trl.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(cmd.strip(), info, args, runs)
    print("\n" + text)
    if args.write:
        # Sections other benches own (after KEEP_MARKER, e.g. LoRA vs full fine-tuning) are kept.
        old = Path(args.write).read_text() if Path(args.write).exists() else ""
        kept = old[old.index(KEEP_MARKER):] if KEEP_MARKER in old else ""
        Path(args.write).write_text(text.rstrip("\n") + "\n\n" + kept if kept else text)
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
