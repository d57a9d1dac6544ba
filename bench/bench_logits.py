"""Memory and time of the response log-prob head: autograd graph vs chunked (algorithms/ops.py).

At a real vocabulary the [sequences, response, vocabulary] logits dominate a training
micro-batch (docs/scale.md). This runs one forward (log-probs + the entropy metric) and
backward over random fp32 logits of that shape twice, each in a fresh process: ``graph`` =
``logprobs_from_logits`` + ``entropy_from_logits`` under no_grad (the trainer's path before
2026-12-01), ``chunked`` = ``logprobs_entropy_chunked``. It prints each one's peak RSS above the
logits themselves (in units of one logits tensor) and the time ratio.

    .venv/bin/python bench/bench_logits.py [--sequences 2] [--response 512] [--vocab 151936]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def rss_kib() -> int:
    """This process's resident set now (KiB); bench_checkpointing.py uses it too."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def one(mode: str, sequences: int, response: int, vocab: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from algorithms import ops

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(sequences, response, vocab, generator=gen).mul_(3).requires_grad_(True)  # one allocation
    labels = torch.randint(0, vocab, (sequences, response), generator=gen)
    weights = torch.randn(sequences, response, generator=gen)
    before_kib = rss_kib()  # the logits are allocated and touched
    t0 = time.perf_counter()
    if mode == "graph":
        logp = ops.logprobs_from_logits(logits, labels)
        with torch.no_grad():
            entropy = ops.entropy_from_logits(logits)
    else:
        logp, entropy = ops.logprobs_entropy_chunked(logits, labels, with_entropy=True)
    (logp * weights).sum().backward()
    seconds = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tensor_kib = logits.numel() * 4 / 1024
    return {"mode": mode, "seconds": round(seconds, 3), "extra_peak_gib": round((peak_kib - before_kib) / 2**20, 3),
            "extra_peak_logits_copies": round((peak_kib - before_kib) / tensor_kib, 2),
            "entropy_mean": round(float(entropy.mean()), 6)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sequences", type=int, default=2)
    p.add_argument("--response", type=int, default=512)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--mode", choices=["graph", "chunked"], help=argparse.SUPPRESS)  # one child run
    args = p.parse_args()
    if args.mode:
        print(json.dumps(one(args.mode, args.sequences, args.response, args.vocab)))
        return
    rows = {}
    for mode in ("graph", "chunked"):
        out = subprocess.run([sys.executable, __file__, "--mode", mode, "--sequences", str(args.sequences),
                              "--response", str(args.response), "--vocab", str(args.vocab)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        rows[mode] = json.loads(out)
    logits_gib = args.sequences * args.response * args.vocab * 4 / 2**30
    print(json.dumps({"sequences": args.sequences, "response": args.response, "vocab": args.vocab,
                      "logits_gib": round(logits_gib, 3), **rows,
                      "chunked_over_graph_time": round(rows["chunked"]["seconds"] / rows["graph"]["seconds"], 2),
                      "chunked_over_graph_extra_memory": round(
                          rows["chunked"]["extra_peak_gib"] / max(rows["graph"]["extra_peak_gib"], 1e-9), 2),
                      "threads": torch.get_num_threads()}))  # fmt: skip


if __name__ == "__main__":
    main()
