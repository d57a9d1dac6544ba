"""Per-rank memory of the trainer at 1, 2 and 4 ranks (gloo on CPU), phase by phase (docs/scale.md).

Each rank is its own process (as the harness's workers are) and runs the harness's own code for a
random-init Qwen2 saved as safetensors (the default shape: 12 layers, hidden 768, MLP 2304, vocab 32000,
105M parameters, fp32 masters):

- ``load``: ``empty_causal_lm`` + ``TrainEngine`` (built on the meta device, sharded, each rank reading
  its own rows of the checkpoint; AdamW built);
- ``train``: ``--steps`` optimizer steps (default 1) over ``--micro`` micro-batches (forward, backward, step);
- ``sync``: the weights for the rollout engine at bf16, as ``Worker.sync_weights`` takes them
  (``TrainEngine.full_tensors``: one tensor at a time, each dropped once "sent": the engine itself
  lives in another process, vLLM's);
- ``checkpoint``: as ``Worker.save_state`` and ``Worker.export_policy`` write one: each rank its own
  shards of the weights and AdamW moments (``TrainEngine.save_sharded``), then the policy's weights as
  safetensors, gathered one tensor at a time and written by rank 0. The baseline (``before``) gathers
  the full model and optimizer on rank 0, as the checkpoint did until 2026-12-05.

For each phase, each rank's peak RSS (VmHWM, reset before the phase through /proc/self/clear_refs) and
its RSS after the phase, both above the rank's RSS before loading (Python, torch, the process group).
``persistent`` is the RSS after ``train`` (the shards of the weights and AdamW's moments: what a rank
keeps); ``transient`` a phase's peak above the larger of the RSS it started and ended with (what it
held only while it ran: for ``train``, activations and gradients, not the AdamW moments it creates). glibc is told to return freed blocks
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) so that RSS follows what is live.

    .venv/bin/python bench/bench_rank_memory.py [--ranks 1,2,4] [--layers 12] [--hidden 768] [--vocab 32000]

Prints a Markdown table and writes ``--out`` (JSON) with every number and the ``harness plan``-style
prediction beside it (bytes per parameter x parameters / ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024**2
PHASES = ("load", "train", "sync", "checkpoint")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--intermediate", type=int, default=2304)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--sequences", type=int, default=2, help="rows per micro-batch")
    p.add_argument("--tokens", type=int, default=32, help="prompt and response tokens each")
    p.add_argument("--micro", type=int, default=2, help="micro-batches accumulated into the step")
    p.add_argument("--code", default="before,after",
                   help="after: the harness's paths; before: the paths it replaced (the baseline, same run)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                   help="trainer.precision: bf16 = bf16 compute over fp32 masters (the GPU presets')")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--steps", type=int, default=1, help="optimizer steps in the train phase")
    p.add_argument("--lora", type=int, default=0, help="LoRA rank on every attention and MLP projection (0 = off); "
                   "the base loads whole, as peft needs; the sync merges (before: the whole state, after: as gathered)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the rank's tensors live: cpu (RSS measured) or cuda (torch's allocator measured)")
    p.add_argument("--out", default="")
    p.add_argument("--rank-worker", default="", help=argparse.SUPPRESS)  # internal: "RANK,WORLD,PORT,MODEL_DIR,CODE"
    return p.parse_args(argv)


def rank_main(args) -> dict:
    """One rank: the four phases, measured. Runs in its own process."""
    rank, world, port, model_dir, code = args.rank_worker.split(",")
    before = code == "before"
    os.environ.update(RANK=rank, WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOCAL_RANK=rank)
    sys.path.insert(0, str(ROOT))
    import gc

    import torch
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401  (its import is in the base, not in "load")
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from transformers import AutoModelForCausalLM  # noqa: F401

    from harness.runtime.loading import load_causal_lm, write_safetensors
    from harness.runtime.train import lora
    from harness.runtime.train.fsdp import TrainEngine, init_distributed
    from harness.runtime.train.meta_init import empty_causal_lm
    from harness.runtime.workers.phase_memory import reset_cpu_peak, status_bytes

    LORA = SimpleNamespace(rank=args.lora, alpha=2.0 * args.lora, dropout=0.0, roles=(),
                           target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))  # fmt: skip

    def _status(key: str) -> int:
        value = status_bytes(key)
        if value is None:
            raise KeyError(f"{key} not in /proc/self/status (the bench needs Linux)")
        return value

    def _reset_peak() -> None:
        if not reset_cpu_peak():
            raise OSError("/proc/self/clear_refs is not writable: the phases' peaks cannot be reset")

    device = getattr(args, "device", "cpu")
    cuda = device == "cuda"
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if cuda:  # one GPU plays this rank (under the fake group init_distributed returns at once)
        torch.cuda.set_device(0)
    init_distributed(device)

    def _now() -> int:  # bytes this rank holds: the CUDA allocator's, or the process's RSS
        if cuda:
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return _status("VmRSS")

    def _peak() -> int:
        return torch.cuda.max_memory_allocated() if cuda else _status("VmHWM")

    gc.collect()
    base = _now()
    out: dict = {"rank": int(rank), "base_mib": base / MIB, "device": device}

    def measure(name: str, fn):
        gc.collect()
        start = _now()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            _reset_peak()
        result = fn()
        peak = _peak()
        del result
        gc.collect()
        after = _now()
        out[name] = {"peak_mib": (peak - base) / MIB, "after_mib": (after - base) / MIB,
                     "transient_mib": (peak - max(start, after)) / MIB}  # above what the phase began and ended with

    engine = None

    def load():
        nonlocal engine
        optim = SimpleNamespace(lr=1e-5, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0, grad_clip=1.0)
        model = load_causal_lm(model_dir, "float32") if before or args.lora else empty_causal_lm(model_dir, "float32")
        if args.lora:
            model = lora.add_adapters(model, LORA)
        engine = TrainEngine(model, device, args.precision, optim)

    def train():  # --steps optimizer steps: from the second on, AdamW's moments exist during backward
        g = torch.Generator().manual_seed(int(rank))
        n, t = args.sequences, args.tokens
        for _ in range(args.steps):
            for k in range(args.micro):  # after: gradients reduce-scattered at each backward, never unsharded
                if before and int(world) > 1:  # accumulated unsharded, reduced after the last micro-batch
                    engine.model.set_requires_gradient_sync(k == args.micro - 1)
                batch = SimpleNamespace(prompt_ids=torch.randint(0, args.vocab, (n, t), generator=g),
                                        prompt_mask=torch.ones(n, t, dtype=torch.bool),
                                        response_ids=torch.randint(0, args.vocab, (n, t), generator=g),
                                        response_mask=torch.ones(n, t, dtype=torch.bool))  # fmt: skip
                logp, _ = engine.forward(batch)
                (-logp.mean()).backward()
            norm = engine.optimizer_step()
        return norm

    def sync():
        sent = 0
        if args.lora:  # the engine serves the merged model: W0 + (alpha/r) B A
            scale = lora.scaling(LORA)
            pairs = (iter(lora.merged(engine.full_state_dict(all_ranks=True), scale).items()) if before
                     else lora.merged_stream(engine.full_tensors(), scale))  # fmt: skip
        elif before:  # the whole state gathered at once (fp32), then cast
            full = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True))
            pairs = iter({k: v.to(torch.bfloat16).cpu() for k, v in full.items()}.items())
            del full
        else:
            pairs = engine.full_tensors(dtype=torch.bfloat16)
        for _name, tensor in pairs:
            sent += tensor.numel()  # "sent": the engine copies it in, then it is dropped
        return sent

    def checkpoint():
        if before:
            full = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return (get_model_state_dict(engine.model, options=full),
                    get_optimizer_state_dict(engine.model, engine.optimizer, options=full))  # fmt: skip
        target = Path(model_dir) / f"checkpoint-{world}"
        engine.save_sharded(str(target / "engine"))
        tensors = engine.full_tensors()
        if rank == "0":
            write_safetensors(tensors, str(target / "policy"))
        for _ in tensors:  # the other ranks take part in each gather
            pass

    measure("load", load)
    measure("train", train)
    measure("sync", sync)
    measure("checkpoint", checkpoint)
    out["params"] = sum(p.numel() for p in engine.model.parameters())  # DTensors: full sizes
    import torch.distributed as dist

    dist.destroy_process_group()
    return out


def build_model(args, directory: Path) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True)  # fmt: skip
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(args, world: int, model_dir: Path, code: str) -> list[dict]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "1"}
    port = _free_port()
    forwarded = [a for a in sys.argv[1:] if not a.startswith("--rank-worker")]
    procs = [subprocess.Popen([sys.executable, __file__, *forwarded, "--rank-worker", f"{r},{world},{port},{model_dir},{code}"],
                              stdout=subprocess.PIPE, text=True, env=env) for r in range(world)]  # fmt: skip
    results = []
    for p in procs:
        stdout, _ = p.communicate(timeout=3600)
        if p.returncode:
            raise SystemExit(f"a rank of world size {world} failed (exit {p.returncode})")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return sorted(results, key=lambda r: r["rank"])


def predicted_mib(params: int, world: int) -> float:
    """What a rank keeps (``harness plan``): fp32 weights + AdamW's two fp32 moments, 12 bytes per parameter, sharded."""
    return 12 * params / world / MIB


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rank_worker:
        print(json.dumps(rank_main(args)), flush=True)
        return 0
    worlds = [int(w) for w in args.ranks.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        params = build_model(args, Path(tmp))
        print(f"model: {params / 1e6:.1f}M parameters (fp32 {4 * params / MIB:.0f} MiB)", flush=True)
        codes = args.code.split(",")
        rows = {(c, w): run_world(args, w, Path(tmp), c) for c in codes for w in worlds}
    print("\n| code | ranks | rank | " + " | ".join(f"{p} peak / after (MiB)" for p in PHASES) + " | persistent (plan) |")
    print("|---" * (4 + len(PHASES)) + "|")
    for (c, w), ranks in rows.items():
        plan = predicted_mib(params, w)
        for r in ranks:
            cells = " | ".join(f"{r[p]['peak_mib']:.0f} / {r[p]['after_mib']:.0f}" for p in PHASES)
            print(f"| {c} | {w} | {r['rank']} | {cells} | {r['train']['after_mib']:.0f} ({plan:.0f}) |")
    for c in codes:
        one = max(r["train"]["after_mib"] for r in rows[(c, worlds[0])])
        for w in worlds:
            worst = max(r["train"]["after_mib"] for r in rows[(c, w)])
            peaks = {p: max(r[p]["transient_mib"] for r in rows[(c, w)]) for p in PHASES}
            print(f"{c}, ranks {w}: persistent {worst:.0f} MiB per rank = {worst / one:.2f}x of {worlds[0]} rank(s) "
                  f"(1/N = {worlds[0] / w:.2f}); worst transients (MiB): "
                  + ", ".join(f"{p} {v:.0f}" for p, v in peaks.items()))  # fmt: skip
    if args.out:
        worlds_out = {f"{c}/{w}": ranks for (c, w), ranks in rows.items()}
        Path(args.out).write_text(json.dumps({"params": params, "args": vars(args), "worlds": worlds_out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
