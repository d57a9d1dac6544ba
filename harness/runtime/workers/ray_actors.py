"""``runtime.launcher=ray``: the workers as Ray actors, one per GPU (or per worker on CPU).

The actors sit in a placement group (one bundle each, packed onto as few nodes as
possible) and join one torch process group whose rendezvous is rank 0's node. Each
actor hosts the very ``Worker`` class of the local launcher; the driver loop is the same.

``runtime.ray_address``: '' starts a private local Ray (no dashboard) and stops it at
the end; 'auto' or 'host:port' attaches to a running cluster (e.g. the one
scripts/ray_slurm.sbatch starts across a SLURM allocation), which is left running.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from harness.runtime.workers.local import WorkerError, free_port, set_rank_compile_caches

# Environment the actors need from the driver (paths, offline mode, caches).
_PASS_ENV = ("HF_HUB_OFFLINE", "HF_HOME", "HARNESS_CACHE", "TOKENIZERS_PARALLELISM", "TRANSFORMERS_VERBOSITY",
             "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_RPC_BASE_PATH")  # fmt: skip
# Prefixes passed whole: the network settings a multi-node NCCL job needs (NCCL_SOCKET_IFNAME,
# NCCL_IB_HCA, ...), CUDA's and PyTorch's allocator/debug settings, and the HF/vLLM/harness ones.
_PASS_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF", "HF_", "VLLM_", "HARNESS_",
                  "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")  # fmt: skip
PLACEMENT_TIMEOUT_S = 120


def actor_env(environ) -> dict[str, str]:
    """The driver's variables every actor gets (Ray starts actors with the raylet's environment,
    not the driver's: without this, NCCL_SOCKET_IFNAME and friends set in an sbatch script are lost)."""
    return {k: v for k, v in environ.items() if k in _PASS_ENV or k.startswith(_PASS_PREFIXES)}


class RayWorker:
    """Ray actor: hosts one ``Worker`` once ``setup`` has given it its rank."""

    def node_address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), free_port()

    def setup(self, env: dict[str, str], threads: int, worker_args: tuple) -> None:
        os.environ.update(env)
        set_rank_compile_caches(int(env["RANK"]))  # one compile cache per rank (several may share a node)
        import torch

        from harness.runtime.workers.worker import Worker

        torch.set_num_threads(threads)
        self.worker = Worker(*worker_args)

    def call(self, method: str, args: tuple):
        return getattr(self.worker, method)(*args)

    def close(self) -> None:
        import torch.distributed as dist

        if getattr(self, "worker", None) is not None:
            self.worker.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _python_path() -> str:
    """Where the actors import harness, algorithms and user plugins from: this checkout, the
    driver's working directory and PYTHONPATH (actors may start in another directory)."""
    root = str(Path(__file__).resolve().parents[3])  # harness/runtime/workers/ray_actors.py -> the checkout
    paths = [root, os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(paths))


class RayGroup:
    """``size`` Ray actors, rank r in bundle r of a placement group."""

    def __init__(self, size: int, worker_args: tuple, address: str, threads: int, device: str):
        self.size, self.actors, self.pg = size, [], None
        self.started_ray = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, include_dashboard=False)
            else:  # a private local cluster: enough logical CPUs for one actor per worker
                ray.init(num_cpus=max(os.cpu_count() or 1, size), include_dashboard=False)
                self.started_ray = True
        atexit.register(self.close)
        gpu = _wants_gpu(device)
        bundle = {"CPU": 1, "GPU": 1} if gpu else {"CPU": 1}
        self.pg = placement_group([bundle] * size, strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            have = ray.cluster_resources()
            self.close(graceful=False)
            raise WorkerError(
                f"Ray could not place runtime.workers={size} workers of {bundle} each within "
                f"{PLACEMENT_TIMEOUT_S} s; the cluster has {have}. Lower runtime.workers or add nodes."
            )
        env = actor_env(os.environ) | {"PYTHONPATH": _python_path()}
        actor = ray.remote(num_cpus=1, num_gpus=1 if gpu else 0)(RayWorker)
        self.actors = [
            actor.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=r),
                runtime_env={"env_vars": env},
            ).remote()
            for r in range(size)
        ]  # fmt: skip
        addr, port = ray.get(self.actors[0].node_address.remote())
        envs = [
            {"RANK": str(r), "WORLD_SIZE": str(size), "LOCAL_RANK": "0", "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
            for r in range(size)
        ]  # one GPU visible per actor (Ray sets CUDA_VISIBLE_DEVICES), hence LOCAL_RANK 0
        self._gather([a.setup.remote(env, threads, worker_args) for a, env in zip(self.actors, envs)], "starting")

    def _gather(self, refs: list, what: str) -> list:
        """Results in rank order; the first failure stops the group (others may be stuck in a collective)."""
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except Exception as err:  # noqa: BLE001  (a RayTaskError carries the worker's traceback)
                rank = refs.index(done[0])
                self.close(graceful=False)
                raise WorkerError(f"worker {rank} failed {what}:\n{err}") from None
        return ray.get(refs)

    def call(self, method: str, args_per_rank: list[tuple]) -> list:
        return self._gather([a.call.remote(method, args) for a, args in zip(self.actors, args_per_rank)], f"in {method}")

    def close(self, graceful: bool = True) -> None:
        """Stop the actors (graceful: let them shut their engines down first), the placement
        group, and Ray itself if this group started it."""
        atexit.unregister(self.close)
        if self.actors:
            if graceful:
                try:
                    ray.get([a.close.remote() for a in self.actors], timeout=30)
                except Exception:  # noqa: BLE001  (failed or stuck actors are killed below)
                    pass
            for a in self.actors:
                ray.kill(a)
            self.actors = []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None
        if self.started_ray and ray.is_initialized():
            ray.shutdown()
            self.started_ray = False


def _wants_gpu(device: str) -> bool:
    if device == "cuda":
        return True
    if device == "cpu":
        return False
    return bool(ray.cluster_resources().get("GPU", 0))  # auto: GPUs if the cluster has any
