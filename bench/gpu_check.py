"""GPU check: a few GRPO steps of a ~0.5B Qwen2 (random init, offline) with ``rollout=vllm``.

    python bench/gpu_check.py [--steps 4] [--prompts 32] [--n 8] [--max-new 256]
                              [--tokenizer DIR] [--out DIR] [--rollout vllm] [OVERRIDES...]

Builds a Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 KV heads,
intermediate 4864, vocab 151936, tied embeddings) with random weights, saved in bf16
with the Qwen2 tokenizer (``--tokenizer``; default ``shared/data/tokenizers/qwen2`` or
``../shared/data/tokenizers/qwen2``) copied next to it, then trains in this process what

    harness run model.path=<dir> rollout=vllm trainer.precision=bf16 runtime.device=cuda ...

would train, and prints: rollout tokens/s, weight-sync seconds, the step-time split
(median over steps after the first), the rollout/trainer log-prob gap when the engine
logs it, and peak GPU memory (this process's ``torch.cuda.max_memory_allocated`` -- the
trainer; vLLM's engine runs in a child process -- and the whole GPU's ``memory.used``
from ``nvidia-smi``, polled every 0.5 s). Writes ``<out>/gpu_check.json``.

Random weights earn no reward, so advantages are zero: the numbers are about speed and
memory, not learning. Without a Qwen2 tokenizer it falls back to the offline BPE one
(vocab ~256: a much smaller embedding/LM head than Qwen2.5-0.5B's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QWEN05 = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
              intermediate_size=4864, vocab_size=151936)  # fmt: skip
TOKENIZER_CANDIDATES = [ROOT / "shared/data/tokenizers/qwen2", ROOT.parent / "shared/data/tokenizers/qwen2"]
PERF_KEYS = ["perf/step_s", "perf/rollout_s", "perf/score_s", "perf/logp_s", "perf/update_s", "perf/sync_s"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4, help="GRPO steps (the first is a warm-up, not in medians)")
    p.add_argument("--prompts", type=int, default=32, help="trainer.prompts_per_step")
    p.add_argument("--n", type=int, default=8, help="algo.samples_per_prompt")
    p.add_argument("--max-new", type=int, default=256, help="rollout.max_response_tokens")
    p.add_argument("--micro", type=int, default=16, help="trainer.micro_batch_sequences")
    p.add_argument("--rollout", default="vllm", help="rollout backend (vllm | hf)")
    p.add_argument("--tokenizer", default="", help="Qwen2 tokenizer dir (vocab.json + merges.txt)")
    p.add_argument("--out", default=str(ROOT / "results/gpu_check"), help="model + run + summary go here")
    p.add_argument(
        "overrides", nargs="*", help="extra harness overrides, e.g. rollout.gpu_memory_utilization=0.3"
    )
    return p.parse_args(argv)


class GpuMemoryPoller:
    """Peak ``nvidia-smi`` memory.used (MiB) over the whole GPU, polled in a thread."""

    def __init__(self, every_s: float = 0.5):
        self.every_s, self.peak_mib, self._stop = every_s, 0, threading.Event()
        self.available = shutil.which("nvidia-smi") is not None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> int:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )  # fmt: skip
        return max((int(x) for x in out.stdout.split()), default=0)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.peak_mib = max(self.peak_mib, self.read())
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.every_s)

    def __enter__(self):
        if self.available:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self.available:
            self._thread.join(timeout=5)


def find_tokenizer(arg: str) -> Path | None:
    for cand in [Path(arg)] if arg else TOKENIZER_CANDIDATES:
        if (cand / "vocab.json").exists():
            return cand
    return None


def build_model(model_dir: Path, tokenizer_dir: Path | None) -> dict:
    """Random-init Qwen2.5-0.5B-shaped model + tokenizer in ``model_dir`` (bf16 safetensors)."""
    import torch
    from transformers import AutoTokenizer

    from harness.models import new_qwen2

    if (model_dir / "build.json").exists():
        return json.loads((model_dir / "build.json").read_text())
    model_dir.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        for f in tokenizer_dir.iterdir():
            if f.is_file():
                shutil.copy(f, model_dir / f.name)
        tok = AutoTokenizer.from_pretrained(model_dir)
        # The shared copy carries a test chat template; the run renders prompts without one.
        vocab = QWEN05["vocab_size"]
    else:
        from harness.models import train_tokenizer

        texts = [f"What is {a} + {b}? {a + b}" for a in range(100) for b in range(100)]
        tok = train_tokenizer(texts, 256)
        tok.save_pretrained(model_dir)
        vocab = len(tok)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    q = QWEN05
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = new_qwen2(tok, q["hidden_size"], q["intermediate_size"], q["num_hidden_layers"],
                          q["num_attention_heads"], q["num_key_value_heads"], max_positions=4096, vocab_size=vocab,
                          rope_theta=1_000_000.0, torch_dtype="bfloat16").to(torch.bfloat16)  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    info = {"params": params, "vocab_size": vocab, "tokenizer": str(tokenizer_dir or "offline BPE")}
    (model_dir / "build.json").write_text(json.dumps(info))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return info


def compose(overrides: list[str]):
    from harness.config import compose_config

    return compose_config(overrides)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    if not torch.cuda.is_available():
        print("warning: no CUDA device; this check is meant for a GPU machine", file=sys.stderr)
    if args.rollout == "vllm":
        try:
            import vllm
        except Exception as exc:  # noqa: BLE001
            print(f"error: rollout=vllm needs vLLM (pip install -e '.[vllm]'): {exc}", file=sys.stderr)
            return 2
        print(f"vllm {vllm.__version__}, torch {torch.__version__}")

    out = Path(args.out)
    model_dir, run_dir = out / "model", out / "run"
    tokenizer_dir = find_tokenizer(args.tokenizer)
    t0 = time.perf_counter()
    info = build_model(model_dir, tokenizer_dir)
    print(f"model: {info['params'] / 1e6:.0f}M params, vocab {info['vocab_size']}, tokenizer {info['tokenizer']}"
          f" ({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    shutil.rmtree(run_dir, ignore_errors=True)
    overrides = [
        f"model.path={model_dir}",
        f"rollout={args.rollout}",
        "trainer.precision=bf16",
        "runtime.device=cuda" if torch.cuda.is_available() else "runtime.device=cpu",
        f"trainer.steps={args.steps}",
        f"trainer.prompts_per_step={args.prompts}",
        f"algo.samples_per_prompt={args.n}",
        f"rollout.max_response_tokens={args.max_new}",
        f"trainer.micro_batch_sequences={args.micro}",
        f"trainer.eval_every={10 * args.steps}",  # evals at step 0 and the end only
        "task.eval_prompts=32",
        "task.use_chat_template=false",
        f"run_dir={run_dir}",
        *args.overrides,
    ]
    print("equivalent command:\n  harness run " + " ".join(overrides), flush=True)
    cfg = compose(overrides)

    from rich.console import Console

    from harness.trainer import train

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with GpuMemoryPoller() as poller:
        train(cfg, str(run_dir), console=Console())
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    steps = [r for r in rows if "perf/step_s" in r]
    timed = steps[1:] or steps  # the first step warms up (compile, CUDA graphs, allocator)
    med = {
        k: statistics.median(r[k] for r in timed if k in r) for k in PERF_KEYS if any(k in r for r in timed)
    }
    summary = {
        "model": info,
        "rollout": args.rollout,
        "steps": len(steps),
        "wall_s": wall,
        "rollout_tokens_per_s": statistics.median(r["perf/rollout_tokens_per_s"] for r in timed),
        "step_split_s": med,
        "logp_gap_max": max(
            (r["rollout/logp_gap_max"] for r in steps if "rollout/logp_gap_max" in r), default=None
        ),
        "logp_gap_mean": statistics.mean(
            [r["rollout/logp_gap_mean"] for r in steps if "rollout/logp_gap_mean" in r]
        )
        if any("rollout/logp_gap_mean" in r for r in steps)
        else None,
        "trainer_peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30
        if torch.cuda.is_available()
        else None,
        "gpu_peak_used_gib_nvidia_smi": poller.peak_mib / 1024 if poller.available else None,
    }
    print(f"\nGPU check ({len(steps)} steps, medians over {len(timed)}, wall {wall:.0f} s):")
    print(f"  rollout tokens/s        {summary['rollout_tokens_per_s']:12,.0f}")
    for k, v in med.items():
        share = f"{100 * v / med['perf/step_s']:5.1f}%" if k != "perf/step_s" and "perf/step_s" in med else ""
        print(f"  {k:<22} {v:10.3f} s {share}")
    if summary["logp_gap_max"] is not None:
        print(f"  logp gap max / mean     {summary['logp_gap_max']:.4g} / {summary['logp_gap_mean']:.4g}")
    if summary["trainer_peak_allocated_gib"] is not None:
        print(f"  peak allocated, trainer {summary['trainer_peak_allocated_gib']:10.2f} GiB (torch.cuda)")
    if summary["gpu_peak_used_gib_nvidia_smi"] is not None:
        print(f"  peak used, whole GPU    {summary['gpu_peak_used_gib_nvidia_smi']:10.2f} GiB (nvidia-smi)")
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    sys.exit(main())
