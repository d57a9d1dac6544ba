"""Exact checker for the synthetic ``arith`` task.

The response must state one integer (optionally after ``=``, or as ``\\boxed{N}`` /
``#### N``); the first integer in the response is the answer. Anything else scores 0.
"""

from __future__ import annotations

import re

from rewards.registry import Checker, Verdict, register_checker

_INT = re.compile(r"-?\d+")


@register_checker("arith", version="1", summary="exact integer match for the synthetic arith task")
class ArithChecker(Checker):
    def _score(self, response: str, ground_truth: str) -> Verdict:
        match = _INT.search(response[:200])
        if match is None:
            return Verdict(0.0, False, None, "no_answer")
        extracted = match.group(0)
        if int(extracted) == int(ground_truth):
            return Verdict(1.0, True, extracted, "match")
        return Verdict(0.0, False, extracted, "mismatch")
