"""One rank of an N-rank FSDP2 job at 1.5B-7B, measured on CPU in one process (issue #65; docs/scale.md).

torch's fake process group (``torch.testing._internal.distributed.fake_pg``, backend "fake") answers every
collective at once without talking to anyone, but allocates its output buffers for real. One process
can so play rank R of an N-rank job with the harness's own code (bench/bench_rank_memory.py's phases:
``empty_causal_lm`` + ``TrainEngine`` reading this rank's rows of the checkpoint; one optimizer step at
short sequences, with FSDP2's all-gathered layers and root, the fp32 reduce-scatter inputs and AdamW's
moments; the cast-then-gather sync, one tensor at a time, to a receiver that drops it; the sharded
checkpoint and the streamed safetensors export) at the memory that rank holds on a real job.

What the fake group cannot give, and what stands in: gathered tensors hold zeros or garbage, not the
other ranks' shards (the memory is real, the values are not, so the step's numbers mean nothing); and
torch.distributed.checkpoint's global plan sees one rank's chunks only, so its coverage check is
switched off for the checkpoint phase (this rank's files are written as on a real job).

The model: Qwen2.5's shapes (1.5B, 3B, 7B: config.json values of the public checkpoints) with random
bf16 weights written once as safetensors under ``--dir`` (no download; 7B: 15 GB of disk, 2-3 min).

    .venv/bin/python bench/bench_fake_ranks.py --shape 7b --world 16 --sequences 1 --tokens 16 [--dir DIR]

Prints each phase's peak and after-phase RSS (above the process's RSS before loading) beside
``harness plan``'s terms for the same configuration, and writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
GIB = 1024**3

# Qwen2.5's config.json values (hidden, intermediate, layers, heads, kv heads, vocab, tied embeddings)
SHAPES = {
    "1.5b": (1536, 8960, 28, 12, 2, 151936, True),
    "3b": (2048, 11008, 36, 16, 2, 151936, True),
    "7b": (3584, 18944, 28, 28, 4, 152064, False),
    "tiny": (256, 512, 2, 4, 2, 32000, True),  # tests/runtime/test_meta_init.py: the same path in seconds
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    p.add_argument("--world", type=int, default=8, help="ranks of the job this process plays one of")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="trainer.precision; bf16 compute (the GPU presets') is emulated on a CPU without native bf16, and slow")
    p.add_argument("--sequences", type=int, default=1, help="rows per micro-batch")
    p.add_argument("--tokens", type=int, default=16, help="prompt and response tokens each")
    p.add_argument("--micro", type=int, default=1, help="micro-batches accumulated into each step")
    p.add_argument("--steps", type=int, default=2, help="optimizer steps (the second backward runs beside AdamW's moments)")
    p.add_argument("--lora", type=int, default=0, help="LoRA rank (0 = full fine-tuning); with --code before, the sync "
                   "merges the whole gathered state, as until 2026-12-07")
    p.add_argument("--code", choices=("before", "after"), default="after")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: the rank's tensors on one GPU, measured by torch's allocator (scripts/gpu_check.sh's "
                   "fakerank stage); cpu: the process's RSS")
    p.add_argument("--dir", default="", help="where the random checkpoint is written (kept; default: a temporary one)")
    p.add_argument("--out", default="")
    return p.parse_args(argv)


def write_checkpoint(shape: str, directory: Path) -> int:
    """Qwen2.5-``shape``'s architecture with random bf16 weights (std 0.02) as safetensors; its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.runtime.loading import write_safetensors

    hidden, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    config = Qwen2Config(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                         tie_word_embeddings=tied, max_position_embeddings=4096, torch_dtype="bfloat16")  # fmt: skip
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}  # tied: lm_head is embed_tokens
    done = directory / "config.json"
    if not done.exists():
        g = torch.Generator().manual_seed(0)

        def tensors():
            for name, size in shapes.items():
                yield name, (torch.randn(size, generator=g) * 0.02).to(torch.bfloat16)

        t0 = time.perf_counter()
        write_safetensors(tensors(), str(directory))
        config.save_pretrained(directory)  # last: its presence says the weights are complete
        print(f"wrote {shape} ({sum(map(_numel, shapes.values())) / 1e9:.2f}B parameters) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)  # fmt: skip
    return sum(map(_numel, shapes.values()))


def _numel(size: tuple[int, ...]) -> int:
    n = 1
    for s in size:
        n *= s
    return n


def planned(args, directory: Path) -> dict[str, float]:
    """``harness plan``'s per-worker terms (GiB) for this job: N workers, the bench's micro-batch, no roles."""
    from harness.config import compose_config
    from harness.plan import plan

    cfg = compose_config([f"model.path={directory}", f"runtime.workers={args.world}", "runtime.device=cuda",
                          f"trainer.precision={args.precision}", f"trainer.micro_batch_sequences={args.sequences}",
                          f"trainer.prompts_per_step={args.sequences * args.world}", "algo.samples_per_prompt=1",
                          f"rollout.max_response_tokens={args.tokens}", f"task.max_prompt_tokens={args.tokens}",
                          "rollout=vllm"])  # fmt: skip
    result = plan(cfg, [], prompt_tokens=args.tokens, device_gib=80.0)
    return {name: value / GIB for name, value in result["worker_bytes"].items()}


TRANSIENT = ("gradients", "logits", "layer activations", "entropy bonus", "weight sync", "FSDP")  # harness/plan.py's


def against_plan(measured: dict, plan_gib: dict[str, float]) -> dict[str, tuple[float, float]]:
    """(measured, planned) GiB of what docs/scale.md's table compares: what the rank keeps between updates (after
    the train phase; the plan's persistent terms: parameter shard, AdamW moments) and the train phase's peak (the plan's update terms:
    all but the process overhead and the sync's gathered tensor). Empty without a plan (LoRA)."""
    if not plan_gib:
        return {}
    kept = sum(v for k, v in plan_gib.items() if not k.startswith(TRANSIENT) and k != "process overhead")
    update = sum(v for k, v in plan_gib.items() if not k.startswith("weight sync") and k != "process overhead")
    return {"persistent": (measured["train"]["after_mib"] / 1024, kept),
            "train peak": (measured["train"]["peak_mib"] / 1024, update)}


def main(argv=None) -> int:
    args = parse_args(argv)
    import bench_rank_memory
    import torch.distributed as dist
    import torch.distributed.checkpoint.default_planner as planner
    from torch.testing._internal.distributed.fake_pg import FakeStore

    directory = Path(args.dir) if args.dir else Path(os.environ.get("TMPDIR", "/tmp")) / f"harness-fake-{args.shape}"
    directory.mkdir(parents=True, exist_ok=True)
    params = write_checkpoint(args.shape, directory)
    plan_gib = planned(args, directory) if not args.lora else {}
    # the fake group: every collective returns at once, its outputs allocated (see the module docstring)
    dist.init_process_group("fake", store=FakeStore(), rank=args.rank, world_size=args.world)
    planner._validate_global_plan = lambda *a, **k: []  # this rank's chunks only: the coverage check cannot hold
    phases_args = bench_rank_memory.parse_args(["--vocab", str(SHAPES[args.shape][5]), "--sequences", str(args.sequences),
                                                "--tokens", str(args.tokens), "--micro", str(args.micro),
                                                "--precision", args.precision, "--threads", "2",
                                                "--steps", str(args.steps), "--lora", str(args.lora),
                                                "--device", args.device])  # fmt: skip
    phases_args.rank_worker = f"{args.rank},{args.world},0,{directory},{args.code}"
    t0 = time.perf_counter()
    measured = bench_rank_memory.rank_main(phases_args)
    seconds = time.perf_counter() - t0
    shutil.rmtree(directory / f"checkpoint-{args.world}", ignore_errors=True)  # this rank's shards and the export
    print(f"\nQwen2.5-{args.shape} shapes ({params / 1e9:.2f}B parameters), rank {args.rank} of {args.world}, "
          f"{args.precision} compute, {args.steps} step(s) of {args.micro} micro-batch(es) of {args.sequences} x "
          f"{2 * args.tokens} tokens{f', LoRA r{args.lora}' if args.lora else ''}, code {args.code}, "
          f"{seconds:.0f} s\n")  # fmt: skip
    print("| phase | peak (GiB) | after (GiB) | transient (GiB) |\n|---|---|---|---|")
    for phase in bench_rank_memory.PHASES:
        m = measured[phase]
        print(f"| {phase} | {m['peak_mib'] / 1024:.2f} | {m['after_mib'] / 1024:.2f} | {m['transient_mib'] / 1024:.2f} |")
    print("\nharness plan, per worker (GiB):")
    for name, gib in plan_gib.items():
        print(f"  {name:<70} {gib:8.2f}")
    against = against_plan(measured, plan_gib)
    for what, (got, want) in against.items():
        print(f"{what}: measured {got:.2f} GiB, plan {want:.2f} GiB ({(got - want) / want:+.0%})")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "params": params, "seconds": seconds,
                                              "measured": measured, "plan_gib": plan_gib, "against_plan": against},
                                             indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # glibc reads these at startup: RSS must follow what is live
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "2"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    sys.exit(main())
