"""What mask replay (rollout.mask_replay) costs the trainer per token: ``replay_kept_set`` (a top-k over the
vocabulary, a threshold, one masked copy of the logits) beside the log-prob it feeds (the chunked log-softmax
the trainer always takes), at Qwen2.5's vocabulary (151936), CPU, fp32 logits of one micro-batch.

    .venv/bin/python bench/bench_mask_replay.py [--tokens 256] [--vocab 151936] [--kept 20,1000]

Prints seconds per token of each and their ratio, measured in the same run (the median of --repeats). The
rollout side records one int32 per token (hf: the kept count beside its log-prob; vLLM: the finite entries of
the top_k processed log-probs it already returns with mask replay)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=256, help="response tokens in the micro-batch")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--kept", default="20,1000", help="kept-set sizes to time (top-k 20; a flat top-p step)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    import torch

    from algorithms.ops import logprobs_entropy_chunked, replay_kept_set

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, args.tokens, args.vocab, generator=g) * 3
    labels = logits.argmax(-1)

    def timed(fn) -> float:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) / args.tokens

    base = timed(lambda: logprobs_entropy_chunked(logits, labels))
    print(f"log-prob (chunked log-softmax), {args.tokens} tokens x vocab {args.vocab}: {base * 1e6:.1f} us/token")
    for k in (int(x) for x in args.kept.split(",")):
        kept = torch.full((1, args.tokens), k, dtype=torch.int32)
        extra = timed(lambda kept=kept: replay_kept_set(logits, labels, kept))
        mib = logits.numel() * logits.element_size() / 2**20
        print(f"replay_kept_set, kept {k}: {extra * 1e6:.1f} us/token ({extra / base:.2f}x the log-prob; one masked "
              f"copy of the logits, {mib:.0f} MiB here, and [tokens, {k}] top-k values)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
