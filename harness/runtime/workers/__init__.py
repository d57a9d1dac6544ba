"""Worker groups: where the ``Worker``s of a run live (in-process, local processes, Ray actors), chosen here."""

from __future__ import annotations

from typing import Any

from harness.runtime.workers.local import InProcessGroup, ProcessGroup, rank_devices, worker_threads


def make_group(cfg: Any, worker_args: tuple):
    """The worker group ``cfg.runtime`` asks for (``runtime.launcher``, ``runtime.workers``)."""
    rt, workers = cfg.runtime, int(cfg.runtime.workers)
    if rt.launcher == "ray":
        from harness.runtime.workers.ray_actors import RayGroup  # needs the ray extra

        return RayGroup(workers, worker_args, rt.ray_address, worker_threads(cfg, workers))
    if workers == 1:
        return InProcessGroup(worker_args)
    return ProcessGroup(workers, worker_args, worker_threads(cfg, workers), rank_devices(workers, rt.device))
