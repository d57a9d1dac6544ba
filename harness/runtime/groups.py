"""Choosing the worker group a run asks for: in-process, local processes, or Ray actors."""

from __future__ import annotations

from typing import Any

from harness.runtime.workers import InProcessGroup, ProcessGroup, worker_threads


def make_group(cfg: Any, worker_args: tuple):
    """The worker group ``cfg.runtime`` asks for (``runtime.launcher``, ``runtime.workers``)."""
    rt, workers = cfg.runtime, int(cfg.runtime.workers)
    if rt.launcher == "ray":
        from harness.runtime.ray_group import RayGroup  # needs the ray extra

        return RayGroup(workers, worker_args, rt.ray_address, worker_threads(cfg, workers))
    if workers == 1:
        return InProcessGroup(worker_args)
    return ProcessGroup(workers, worker_args, worker_threads(cfg, workers))
