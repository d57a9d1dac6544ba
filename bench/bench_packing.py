"""Padded vs packed training forward+backward at realistic lengths (trainer.pack_sequences).

A random Qwen2-architecture model (default: 8 layers, hidden 512, the Qwen2 vocabulary size) gets
a batch of sequences whose prompt and response lengths follow GSM8K-like spreads (prompts
60-200 tokens; responses log-normal around 150, capped at --max-response), right-padded as a
rollout returns them. It times one forward+backward of the policy log-probs per micro-batch,
padded (today's path) and packed, in the same run, and prints the padding waste and the ratio.

    .venv/bin/python bench/bench_packing.py [--batch 16] [--micro 4] [--max-response 512]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

import torch


def synthetic_batch(n: int, max_response: int, vocab: int, seed: int = 0):
    from algorithms import Batch

    rng = random.Random(seed)
    prompts = [rng.randint(60, 200) for _ in range(n)]
    responses = [min(max_response, max(8, int(rng.lognormvariate(5.0, 0.6)))) for _ in range(n)]
    P, T = max(prompts), max(responses)
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(0, vocab, (n, P), generator=g)
    prompt_mask = torch.arange(P)[None, :] >= (P - torch.tensor(prompts))[:, None]  # left-padded
    response_ids = torch.randint(0, vocab, (n, T), generator=g)
    response_mask = torch.arange(T)[None, :] < torch.tensor(responses)[:, None]
    return Batch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask,
                 group_ids=torch.arange(n), prompts=[""] * n, responses=[""] * n, ground_truths=[""] * n,
                 truncated=torch.zeros(n, dtype=torch.bool)), prompts, responses  # fmt: skip


def timed(engine, batch, micro: int, pack: bool) -> float:
    engine.pack = pack
    t0 = time.perf_counter()
    for rows in torch.arange(len(batch)).split(micro):
        mb = batch.select(rows)
        out, _ = engine.forward(mb)
        (out * mb.response_mask).sum().backward()
    engine.model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--max-response", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.runtime.train.fsdp import TrainEngine, init_distributed

    init_distributed("cpu")
    torch.manual_seed(0)
    vocab = 151936
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                                         num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                                         num_key_value_heads=max(1, args.hidden // 256), tie_word_embeddings=True))
    engine = TrainEngine(model, "cpu", "fp32", share_prompts=False)
    engine.model.train()
    engine.model.requires_grad_(True)
    batch, prompts, responses = synthetic_batch(args.batch, args.max_response, vocab)
    real = sum(prompts) + sum(responses)
    padded_positions = 0
    for rows in torch.arange(args.batch).split(args.micro):
        padded_positions += len(rows) * (max(prompts[i] for i in rows) + max(responses[i] for i in rows))
    timed(engine, batch.select(torch.arange(min(2, args.batch))), args.micro, True)  # warm-up
    padded = min(timed(engine, batch, args.micro, False) for _ in range(args.repeats))
    packed = min(timed(engine, batch, args.micro, True) for _ in range(args.repeats))
    result = {
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1), "batch": args.batch, "micro": args.micro,
        "real_tokens": real, "padded_positions": padded_positions,
        "padding_waste_frac": round(1 - real / padded_positions, 3),
        "padded_s": round(padded, 2), "packed_s": round(packed, 2), "packed_over_padded": round(packed / padded, 3),
        "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
