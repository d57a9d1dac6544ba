"""Shared machinery of the gsm8k/math checkers: time limits and parallel batches."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from rewards import _pool
from rewards.registry import Checker, Verdict

DEFAULT_TIMEOUT = float(os.environ.get("REWARDS_TIMEOUT", "1.0"))
PARALLEL_MIN = 256  # below this a batch is cheaper to score in-process
PROBE = 32  # items scored in-process to measure whether workers would pay off
PAYS_OFF_S = 0.5e-3  # mean in-process cost per item above which IPC to workers is worth it


def _score_in_worker(cls, kwargs: dict, response: str, ground_truth: str) -> Verdict:
    return _worker_instance(cls, kwargs).score(response, ground_truth)


_WORKER_INSTANCES: dict = {}


def _worker_instance(cls, kwargs: dict):
    key = (cls, tuple(sorted(kwargs.items())))
    if key not in _WORKER_INSTANCES:
        _WORKER_INSTANCES[key] = cls(**kwargs)
    return _WORKER_INSTANCES[key]


class BoundedChecker(Checker):
    """A checker whose every call returns within ``timeout`` seconds (plus IPC slack).

    The fast layers (extraction, normalisation, exact/numeric comparison) are
    bounded by construction and run in-process.  Anything else goes through
    ``self.bounded(fn, *args)``: in a worker process killed at the limit.
    ``score_batch`` fans big batches out over the worker pool; a stuck item
    costs that item a ``"timeout"`` verdict and the pool one worker, which is
    replaced.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, parallel_min: int = PARALLEL_MIN, **options):
        self.timeout = float(timeout)
        self.parallel_min = int(parallel_min)
        self.options = options

    def _config(self) -> dict:
        return {"timeout": self.timeout, "parallel_min": self.parallel_min, **self.options}

    def bounded(self, fn, *args):
        """``fn(*args)`` under the hard time limit; None when it timed out or failed."""
        if _pool.IN_WORKER:  # this process is itself policed by the parent
            return fn(*args)
        try:
            status, value = _pool.shared_pool().call(fn, args, self.timeout)
        except (RuntimeError, OSError):
            return None
        return value if status == "ok" else None

    def score(self, response: str, ground_truth: str) -> Verdict:
        start = time.monotonic()
        verdict = super().score(response, ground_truth)
        if time.monotonic() - start > 10 * self.timeout:  # should not happen; keep it visible
            return Verdict(0.0, False, verdict.extracted, "timeout")
        return verdict

    def score_batch(self, responses: Sequence[str], ground_truths: Sequence[str]) -> list[Verdict]:
        if len(responses) != len(ground_truths):
            raise ValueError(
                f"score_batch got {len(responses)} responses but {len(ground_truths)} ground truths"
            )
        if len(responses) < self.parallel_min or _pool.IN_WORKER:
            return [self.score(r, g) for r, g in zip(responses, ground_truths)]
        # Probe: most checks take tens of microseconds, less than shipping them to a worker.
        probe = min(PROBE, len(responses))
        start = time.perf_counter()
        head = [self.score(r, g) for r, g in zip(responses[:probe], ground_truths[:probe])]
        mean = (time.perf_counter() - start) / probe
        rest_r, rest_g = list(responses[probe:]), list(ground_truths[probe:])
        if mean < PAYS_OFF_S and self.parallel_min > 1:
            return head + [self.score(r, g) for r, g in zip(rest_r, rest_g)]
        return head + self._score_in_workers(rest_r, rest_g)

    def _score_in_workers(self, responses: list[str], ground_truths: list[str]) -> list[Verdict]:
        cls, cfg = type(self), self._config()
        args = [(cls, cfg, r, g) for r, g in zip(responses, ground_truths)]
        try:
            outs = _pool.shared_pool().map(_score_in_worker, args, self.timeout, chunk=32)
        except (RuntimeError, OSError):  # no worker processes here: score in-process
            return [self.score(r, g) for r, g in zip(responses, ground_truths)]
        verdicts = []
        for status, value in outs:
            if status == "ok":
                verdicts.append(value)
            elif status == "timeout":
                verdicts.append(Verdict(0.0, False, None, "timeout"))
            else:
                verdicts.append(Verdict(0.0, False, None, f"error:{value}"))
        return verdicts
