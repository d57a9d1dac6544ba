"""Verifiable reward checkers.

Contract (other tools call it):

    checker = rewards.get("gsm8k")
    verdict = checker.score(response, ground_truth)      # -> Verdict, never raises
    verdicts = checker.score_batch(responses, ground_truths)
    checker.name, checker.version                        # recorded as "name@version"

New checkers register with ``@register_checker("name", version="1")`` on a
``Checker`` subclass.
"""

from rewards.registry import (
    Checker,
    Verdict,
    available,
    get,
    register_checker,
    summaries,
)

__all__ = ["Checker", "Verdict", "available", "get", "register_checker", "summaries"]
