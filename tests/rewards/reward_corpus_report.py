"""Accuracy of our `math` checker vs Math-Verify on the peer-suite corpus.

Run as a script for the per-source table:
    .venv/bin/python tests/rewards/reward_corpus_report.py
"""

from __future__ import annotations

import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from reward_peer_cases import CASES, source_family  # noqa: E402

import rewards  # noqa: E402


def math_verify_judge():
    from math_verify import parse, verify

    def judge(gold: str, response: str) -> bool:
        try:
            return bool(verify(parse(gold), parse(response)))
        except Exception:
            return False

    return judge


def ours_judge(name: str = "math"):
    checker = rewards.get(name)
    return lambda gold, response: checker.score(response, gold).correct


def tally(judge, cases=CASES):
    """source -> Counter(correct, fp, fn, n) plus the list of misjudged cases."""
    stats: dict = collections.defaultdict(collections.Counter)
    wrong = []
    for gold, response, expected, source in cases:
        got = judge(gold, response)
        fam = source_family(source)
        for key in (fam, "ALL"):
            stats[key]["n"] += 1
            stats[key]["right"] += int(got == bool(expected))
            stats[key]["fp"] += int(got and not expected)
            stats[key]["fn"] += int(expected and not got)
        if got != bool(expected):
            wrong.append((gold, response, expected, source))
    return stats, wrong


def main() -> None:
    ours, ours_wrong = tally(ours_judge())
    theirs, theirs_wrong = tally(math_verify_judge())
    print(f"{'source':<14}{'n':>5} | {'ours acc':>9}{'FP':>4}{'FN':>4} | {'math-verify acc':>16}{'FP':>4}{'FN':>4}")
    for src in sorted(ours, key=lambda s: (s == "ALL", s)):
        o, t = ours[src], theirs[src]
        print(f"{src:<14}{o['n']:>5} | {o['right'] / o['n']:>9.3f}{o['fp']:>4}{o['fn']:>4} | "
              f"{t['right'] / t['n']:>16.3f}{t['fp']:>4}{t['fn']:>4}")
    if "-v" in sys.argv:
        print("\nours wrong:")
        for case in ours_wrong:
            print("  ", repr(case[0])[:80], "|", repr(case[1])[-100:], "| expected", case[2], case[3])
        print("\nmath-verify wrong:")
        for case in theirs_wrong:
            print("  ", repr(case[0])[:80], "|", repr(case[1])[-100:], "| expected", case[2], case[3])


if __name__ == "__main__":
    main()
