"""Each phase's memory in a training worker (load, train, sync, checkpoint), for the metrics.

CUDA: the bytes of tensors the caching allocator hands out, ``torch.cuda.max_memory_allocated`` over the
phase (reset as it starts) and ``torch.cuda.memory_allocated`` after it: what ``harness plan`` predicts,
less its process overhead (the CUDA context and the allocator's unused cache are not counted). CPU
(Linux): the process's resident set after each phase (VmRSS), less the RSS before the worker loaded
anything. A CPU phase's peak needs the process's high-water mark reset (/proc/self/clear_refs, as
bench/bench_rank_memory.py does), which is also what ``getrusage`` and ``/usr/bin/time`` report as the
process's peak: a run leaves it alone, and only ``cpu_peaks=True`` (tests) resets it. In pipelined
runs generation overlaps the update, so a phase's peak includes what the rollout held meanwhile.

Logged as ``perf/memory/<phase>_peak_gib`` (CUDA) and ``perf/memory/<phase>_after_gib`` (the worst
worker) at the first step after the phase ran: ``load`` at step 1, a checkpoint at the step after it.
Under ``perf/``: memory, like time, is not part of what two runs of one seed must share.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

GIB = 1024**3


def status_bytes(key: str) -> int | None:
    """A ``/proc/self/status`` line in bytes (VmRSS, VmHWM), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_cpu_peak() -> bool:
    """VmHWM back to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PhaseMemory:
    """``with memory.phase("train"): ...`` records the phase's peak and what it left; ``report()`` the
    phases seen since the last report (the largest peak of repeated phases, the last ``after``)."""

    def __init__(self, device: str, cpu_peaks: bool = False):
        self.cuda = device == "cuda"
        self.base = 0 if self.cuda else status_bytes("VmRSS") or 0
        self.peaks = self.cuda or (cpu_peaks and reset_cpu_peak())
        self.seen: dict[str, tuple[int | None, int]] = {}

    def _read(self) -> tuple[int | None, int]:
        if self.cuda:
            return torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
        peak, now = status_bytes("VmHWM"), status_bytes("VmRSS") or 0
        return (peak - self.base if self.peaks and peak is not None else None), now - self.base

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        elif self.peaks:
            reset_cpu_peak()
        try:
            yield
        finally:
            peak, after = self._read()
            peaks = [p for p in (peak, self.seen.get(name, (None, 0))[0]) if p is not None]
            self.seen[name] = (max(peaks) if peaks else None, after)

    def report(self) -> dict[str, float]:
        out = {}
        for name, (peak, after) in self.seen.items():
            if peak is not None:
                out[f"perf/memory/{name}_peak_gib"] = peak / GIB
            out[f"perf/memory/{name}_after_gib"] = after / GIB
        self.seen = {}
        return out
