"""Worker groups: where the ``Worker``s of a run live (in-process, local processes, Ray actors), chosen here."""

from __future__ import annotations

from harness.runtime.settings import RuntimeConfig
from harness.runtime.workers.local import InProcessGroup, ProcessGroup, rank_devices, worker_threads


def make_group(group: RuntimeConfig, worker_args: tuple):
    """The worker group ``runtime.*`` asks for (``runtime.launcher``, ``runtime.workers``)."""
    rt, workers = group, group.workers
    if rt.launcher == "ray":
        from harness.runtime.workers.ray_actors import RayGroup  # needs the ray extra

        return RayGroup(workers, worker_args, rt.ray_address, worker_threads(rt.threads, workers), rt.device)
    if workers == 1:
        return InProcessGroup(worker_args)
    return ProcessGroup(workers, worker_args, worker_threads(rt.threads, workers), rank_devices(workers, rt.device))
