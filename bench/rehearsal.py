"""Dress rehearsal at real size (issue #15): one `harness run` of a Qwen2.5-0.5B-shaped model.

    python bench/rehearsal.py --algo grpo --rollout hf --workers 2 --steps 2
    python bench/rehearsal.py --lora 8 --workers 2          # LoRA rank 8 on the policy
    python bench/rehearsal.py --shape small-96m --lora 8 --response-tokens 256   # docs/performance.md
    make rehearsal                          # grpo, hf, 1 worker, 1 step; the numbers for docs/scale.md

The model has Qwen2.5-0.5B's public configuration (24 layers, hidden 896, 14 heads / 2 KV heads,
MLP 4864, vocabulary 151936, tied embeddings: 494M parameters) with random weights (no hub
here), the Qwen2 tokenizer of ../shared/data/tokenizers/qwen2 with its chat template, GSM8K from
../shared/data with the gsm8k preset's prompt, and a 512-token response cap. Random weights
never emit EOS, so every response is 512 tokens: the worst case for memory and time.

Measured: peak RSS of every process of the run (the driver, each worker; read from /proc every
0.2 s, RSS counts pages shared between processes once per process) and the machine's lowest
MemAvailable over the run, the step split and weight
sync seconds from metrics.jsonl, rollout and training tokens/s. Prints one JSON line per run
(and appends it to --out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
QWEN25_05B = {  # Qwen/Qwen2.5-0.5B config.json (public values)
    "hidden_size": 896, "intermediate_size": 4864, "num_layers": 24, "num_heads": 14, "num_kv_heads": 2,
    "vocab_size": 151936, "max_positions": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
}  # fmt: skip
# A 96M-parameter model of the same family (78M of it the tied embedding): where LoRA vs full
# fine-tuning is measured (docs/performance.md).
SMALL_96M = {**QWEN25_05B, "hidden_size": 512, "intermediate_size": 1024, "num_layers": 8, "num_heads": 8}
SHAPES = {"qwen2.5-0.5b": QWEN25_05B, "small-96m": SMALL_96M}


def build_model(out_dir: Path, shape: dict = QWEN25_05B) -> Path:
    """A random model of ``shape`` + the Qwen2 tokenizer (built once, seed 0)."""
    if (out_dir / "config.json").exists():
        return out_dir
    import torch
    from transformers import AutoTokenizer

    from harness.models import new_qwen2

    tokenizer = AutoTokenizer.from_pretrained(SHARED / "tokenizers" / "qwen2")
    torch.manual_seed(0)
    model = new_qwen2(tokenizer, **shape)
    tmp = out_dir.with_name(out_dir.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out_dir)
    return out_dir


def _rss_kb(pid: int) -> dict[str, int]:
    """VmRSS and its parts (RssAnon: heap; RssFile: mapped files, e.g. a checkpoint; RssShmem: /dev/shm), in KiB."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "RssAnon:", "RssFile:", "RssShmem:")):
                key, value = line.split()[:2]
                out[key.rstrip(":")] = int(value)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def _available_kb() -> int:
    """MemAvailable of the whole machine (what the run left for everything else)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            children = []
        out.append(p)
        todo += [int(c) for c in children]
    return out


def _name(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except FileNotFoundError:
        return "?"
    return "worker" if "multiprocessing" in cmd or "spawn" in cmd else "driver" if "harness" in cmd else cmd[:40]


def run(args: argparse.Namespace, model: Path) -> dict:
    tag = re.sub(r"[^A-Za-z0-9._-]+", "_", "-".join(args.overrides)).strip("_")  # a path Hydra parses
    run_dir = Path(args.work) / f"{args.shape}-{args.algo}-{args.rollout}-w{args.workers}-lora{args.lora}{'-' + tag if tag else ''}"
    cmd = [sys.executable, "-m", "harness.commands.cli", "run", f"algo={args.algo}", f"model.path={model}", "task=gsm8k",
           f"task.source={SHARED / 'gsm8k'}", f"rollout={args.rollout}", f"rollout.max_response_tokens={args.response_tokens}",
           f"model.lora.rank={args.lora}",
           f"trainer.steps={args.steps}", f"trainer.prompts_per_step={args.prompts}",
           f"algo.samples_per_prompt={args.samples}", f"trainer.micro_batch_sequences={args.micro}",
           "trainer.eval_every=1000", "task.eval_prompts=2", "trainer.checkpoint_every=0",
           f"runtime.workers={args.workers}", "runtime.device=cpu", f"run_dir={run_dir}", *args.overrides]  # fmt: skip
    if run_dir.exists():  # a finished run would be skipped (runs resume) and report its old numbers
        shutil.rmtree(run_dir)
    peaks: dict[int, tuple[int, str, dict]] = {}
    lowest_available = [_available_kb()]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    done = threading.Event()

    def poll():
        while not done.is_set():
            for pid in _descendants(proc.pid):
                parts = _rss_kb(pid)
                rss = parts.get("VmRSS", 0)
                if rss > peaks.get(pid, (0,))[0]:
                    peaks[pid] = (rss, _name(pid), parts)
            lowest_available[0] = min(lowest_available[0], _available_kb())
            time.sleep(0.2)

    t = threading.Thread(target=poll, daemon=True)
    t0 = time.perf_counter()
    t.start()
    rc = proc.wait()
    done.set()
    t.join()
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()] if rc == 0 else []
    steps = [r for r in rows if r["step"] > 0]

    def median(key):
        vals = sorted(r[key] for r in steps if key in r)
        return vals[len(vals) // 2] if vals else None

    tokens = median("rollout/generated_tokens") or 0
    return {
        "shape": args.shape, "lora_rank": args.lora, "response_tokens": args.response_tokens,
        "algo": args.algo, "rollout": args.rollout, "workers": args.workers, "steps": args.steps, "rc": rc,
        "overrides": args.overrides,
        "sequences_per_step": args.prompts * args.samples, "wall_s": round(wall, 1),
        "peak_rss_gib": {f"{name}:{pid}": round(kb / 2**20, 2) for pid, (kb, name, _) in sorted(peaks.items()) if kb > 200_000},
        # each process's RSS split at its peak: anonymous (heap, tensors), file-backed, /dev/shm
        "peak_rss_parts_gib": {
            f"{name}:{pid}": {k: round(v / 2**20, 2) for k, v in parts.items() if k != "VmRSS"}
            for pid, (kb, name, parts) in sorted(peaks.items())
            if kb > 200_000
        },
        "min_available_gib": round(lowest_available[0] / 2**20, 2),
        "step_s": median("perf/step_s"), "rollout_s": median("perf/rollout_s"), "logp_s": median("perf/logp_s"),
        "update_s": median("perf/update_s"), "sync_s": median("perf/sync_s"),
        "rollout_tokens_per_s": median("perf/rollout_tokens_per_s"),
        "train_tokens_per_s": round(tokens / median("perf/update_s"), 1) if steps else None,
        "response_tokens_mean": median("rollout/response_tokens_mean"),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algo", default="grpo")
    p.add_argument("--rollout", default="hf", choices=["hf", "vllm"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--prompts", type=int, default=2, help="trainer.prompts_per_step")
    p.add_argument("--samples", type=int, default=2, help="algo.samples_per_prompt")
    p.add_argument("--micro", type=int, default=2, help="trainer.micro_batch_sequences")
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES), help="model configuration")
    p.add_argument("--lora", type=int, default=0, help="model.lora.rank (0 = full fine-tuning)")
    p.add_argument("--response-tokens", type=int, default=512, help="rollout.max_response_tokens")
    p.add_argument("--work", default=os.path.expanduser("~/.cache/harness/rehearsal"))
    p.add_argument("--out", default="", help="append the JSON line here")
    p.add_argument("overrides", nargs="*", help="more `harness run` overrides, e.g. model.dtype=bfloat16")
    args = p.parse_args()
    Path(args.work).mkdir(parents=True, exist_ok=True)
    name = "qwen2.5-0.5b-shaped-random" if args.shape == "qwen2.5-0.5b" else f"{args.shape}-random"
    model = build_model(Path(args.work) / name, SHAPES[args.shape])
    result = run(args, model)
    line = json.dumps(result)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    sys.exit(0 if result["rc"] == 0 else 1)


if __name__ == "__main__":
    main()
