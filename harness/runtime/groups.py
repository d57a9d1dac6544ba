"""Choosing the worker group a run asks for: in-process, local processes, or Ray actors."""

from __future__ import annotations

from typing import Any

from harness.runtime.workers import InProcessGroup, ProcessGroup, rank_devices, worker_threads


def make_group(cfg: Any, worker_args: tuple):
    """The worker group ``cfg.runtime`` asks for (``runtime.launcher``, ``runtime.workers``)."""
    rt, workers = cfg.runtime, int(cfg.runtime.workers)
    r = cfg.rollout
    if r.backend == "vllm" and int(r.tensor_parallel_size) != 1 and not r.url:
        from harness.errors import ConfigError

        raise ConfigError(f"rollout.tensor_parallel_size={r.tensor_parallel_size}: a colocated vLLM engine runs on its "
                          f"worker's one GPU; use 1 (an engine over several GPUs: a rollout server, `harness serve "
                          f"rollout=vllm rollout.tensor_parallel_size=N`, and rollout.url)")  # fmt: skip
    if rt.launcher == "ray":
        from harness.runtime.ray_group import RayGroup  # needs the ray extra

        return RayGroup(workers, worker_args, rt.ray_address, worker_threads(cfg, workers))
    if workers == 1:
        return InProcessGroup(worker_args)
    return ProcessGroup(workers, worker_args, worker_threads(cfg, workers), rank_devices(workers, rt.device))
