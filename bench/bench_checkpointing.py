"""Memory and time of a training micro-batch with and without ``trainer.gradient_checkpointing``.

One forward (response log-probs) + backward + AdamW step of the policy's ``TrainEngine`` on a
random-init Qwen2 of the given shape, over ``--sequences`` sequences of ``--prompt`` + ``--response``
tokens, each setting in a fresh process: its peak RSS above the model and optimizer (loaded and
stepped once before timing), the median of ``--repeats`` timed steps, and what ``harness plan``
predicts for the activations of each. Prints one JSON line with both and their ratios.

    .venv/bin/python bench/bench_checkpointing.py [--layers 8] [--hidden 512] [--sequences 8] [--response 512]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from bench_logits import rss_kib  # the script's folder is on sys.path

ROOT = Path(__file__).resolve().parents[1]


def one(args, checkpointing: bool) -> dict:
    sys.path.insert(0, str(ROOT))
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.runtime.train.fsdp import TrainEngine, init_distributed

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    init_distributed("cpu")
    config = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64, num_key_value_heads=2,
                         tie_word_embeddings=True, max_position_embeddings=4096)  # fmt: skip
    optim = SimpleNamespace(lr=1e-5, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0, grad_clip=1.0)
    engine = TrainEngine(Qwen2ForCausalLM(config), "cpu", "fp32", optim, share_prompts=False,
                         checkpointing=checkpointing)  # fmt: skip
    b, p, r = args.sequences, args.prompt, args.response
    batch = SimpleNamespace(prompt_ids=torch.randint(0, args.vocab, (b, p)), prompt_mask=torch.ones(b, p, dtype=torch.bool),
                            response_ids=torch.randint(0, args.vocab, (b, r)),
                            response_mask=torch.ones(b, r, dtype=torch.bool))  # fmt: skip

    def step() -> float:
        t0 = time.perf_counter()
        logp, _ = engine.forward(batch)
        logp.mean().backward()
        engine.optimizer_step()
        return time.perf_counter() - t0

    step()  # gradients and AdamW moments exist from here on
    before_kib = rss_kib()
    times = [step() for _ in range(args.repeats)]
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"checkpointing": checkpointing, "step_s": round(statistics.median(times), 3),
            "extra_peak_gib": round((peak_kib - before_kib) / 2**20, 3),
            "logp_checksum": round(float(engine.forward(batch)[0].detach().double().sum()), 3)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--response", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(one(args, args.child == "on")))
        return
    flags = [f"--{k}={v}" for k, v in vars(args).items() if k != "child"]
    rows = {}
    for mode in ("off", "on"):
        out = subprocess.run([sys.executable, __file__, *flags, f"--child={mode}"], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
        rows[mode] = json.loads(out.strip().splitlines()[-1])
    sys.path.insert(0, str(ROOT))
    from harness.plan import ACT_HIDDEN, ACT_INTERMEDIATE

    tokens = args.sequences * (args.prompt + args.response)
    layer = tokens * 4 * (ACT_HIDDEN * args.hidden + ACT_INTERMEDIATE * 4 * args.hidden)
    plan = {"off": layer * args.layers / 2**30, "on": (tokens * 4 * args.hidden * args.layers + layer) / 2**30}
    print(json.dumps({"shape": {k: getattr(args, k) for k in ("layers", "hidden", "vocab", "sequences", "prompt",
                                                                "response", "threads")},
                      "off": rows["off"], "on": rows["on"],
                      "plan_activations_gib": {k: round(v, 3) for k, v in plan.items()},
                      "time_on_over_off": round(rows["on"]["step_s"] / rows["off"]["step_s"], 2),
                      "memory_on_over_off": round(rows["on"]["extra_peak_gib"] / max(rows["off"]["extra_peak_gib"], 1e-9), 2),
                      "same_logprobs": rows["on"]["logp_checksum"] == rows["off"]["logp_checksum"]}))  # fmt: skip


if __name__ == "__main__":
    main()
