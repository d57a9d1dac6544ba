"""Throughput and latency of the reward checkers vs math-verify on the same inputs.

    .venv/bin/python bench/bench_checkers.py [--n 500] [--no-parallel]

Inputs (built from the shared data, read-only):
  math:   MATH-500 gold solutions scored against their answers (correct), the
          same solutions against another problem's answer (wrong), and the
          peer-suite corpus of tests/rewards/reward_peer_cases.py;
  gsm8k:  GSM8K test solutions ("... #### N") against their answers and against N+1.
math-verify runs ``verify(parse(gold), parse(response))`` on exactly the same pairs.
Prints cases/s, p50/p99 latency per case, and the speed-up over math-verify.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "rewards"))

import rewards  # noqa: E402
from rewards import gsm8k as gsm8k_module  # noqa: E402
from rewards import math as math_module  # noqa: E402

DATA = os.environ.get("HARNESS_DATA", "/work/shared/data")


def load_math(n: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in open(f"{DATA}/math/math500_test.jsonl")][:n]
    pairs = [(r["solution"], r["answer"]) for r in rows]
    pairs += [(r["solution"], rows[(i + 7) % len(rows)]["answer"]) for i, r in enumerate(rows)]
    try:
        from reward_peer_cases import CASES

        pairs += [(response, gold) for gold, response, _, _ in CASES]
    except ImportError:
        pass
    return pairs


def load_gsm8k(n: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in open(f"{DATA}/gsm8k/test.jsonl")][:n]
    pairs = []
    for r in rows:
        gold = r["answer"].rsplit("####", 1)[1].strip()
        pairs.append((r["answer"], gold))
        try:
            pairs.append((r["answer"], str(int(gold.replace(",", "")) + 1)))
        except ValueError:
            pass
    return pairs


def time_each(fn, pairs) -> tuple[float, list[float]]:
    lat = []
    start = time.perf_counter()
    for response, gold in pairs:
        t = time.perf_counter()
        fn(response, gold)
        lat.append(time.perf_counter() - t)
    return time.perf_counter() - start, lat


def p(lat: list[float], q: float) -> float:
    return statistics.quantiles(lat, n=100)[int(q) - 1] if len(lat) > 1 else lat[0]


def math_verify_fn():
    from math_verify import parse, verify

    def fn(response, gold):
        try:
            return verify(parse(gold), parse(response))
        except Exception:
            return False

    return fn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500, help="problems per dataset")
    ap.add_argument("--no-parallel", action="store_true", help="skip the score_batch (worker pool) row")
    args = ap.parse_args()

    suites = {"math": load_math(args.n), "gsm8k": load_gsm8k(args.n)}
    mv = math_verify_fn()
    rows = []
    for name, pairs in suites.items():
        checker = rewards.get(name)
        checker.score(*pairs[0])  # warm imports
        math_module._parse_cached.cache_clear()  # no credit for repeated golds
        gsm8k_module.gold_number.cache_clear()
        total, lat = time_each(checker.score, pairs)
        rows.append((f"{checker.tag} score()", len(pairs), total, lat))
        responses, golds = map(list, zip(*pairs))
        start = time.perf_counter()
        checker.score_batch(responses, golds)
        rows.append((f"{checker.tag} score_batch() adaptive", len(pairs), time.perf_counter() - start, None))
        if not args.no_parallel:
            forced = type(checker)(parallel_min=1)  # always through the worker pool
            forced.score_batch(responses[:64], golds[:64])  # start the workers
            start = time.perf_counter()
            forced.score_batch(responses, golds)
            rows.append((f"{checker.tag} score_batch() workers", len(pairs), time.perf_counter() - start, None))
        total, lat = time_each(mv, pairs)
        rows.append((f"math-verify on {name} inputs", len(pairs), total, lat))

    print(f"cpus: {os.cpu_count()}  (score_batch uses REWARDS_WORKERS or min(4, cpus) workers)")
    print(f"{'checker':<40}{'cases':>7}{'cases/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for label, n, total, lat in rows:
        if lat is None:
            print(f"{label:<40}{n:>7}{n / total:>11.0f}{'-':>9}{'-':>9}{'-':>9}")
        else:
            print(f"{label:<40}{n:>7}{n / total:>11.0f}{p(lat, 50) * 1e3:>9.3f}{p(lat, 99) * 1e3:>9.3f}"
                  f"{max(lat) * 1e3:>9.2f}")
    by_label = {label: n / total for label, n, total, _ in rows}
    for name in suites:
        ours = by_label[f"{rewards.get(name).tag} score()"]
        theirs = by_label[f"math-verify on {name} inputs"]
        print(f"speed-up {name}: {ours / theirs:.1f}x math-verify (single process, same inputs)")


if __name__ == "__main__":
    main()
