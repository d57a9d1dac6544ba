"""Worker groups: where the ``Worker``s of a run live (``runtime.launcher``, ``runtime.workers``).

All groups answer ``call(method, args_per_rank)`` -- run ``Worker.method`` on every rank
at once, rank r with ``args_per_rank[r]``, and return the results in rank order -- so the
driver (``HybridEngine``) is the same single controller whatever the launcher:

* ``InProcessGroup``: one worker in the driver's own process (workers=1, launcher=local).
* ``ProcessGroup``: N spawned processes on this machine, joined by a gloo (CPU) or nccl
  (GPU, one per device) process group; commands and results travel through pipes.
* ``RayGroup`` (harness/runtime/workers/ray_actors.py): N Ray actors in a placement group, on one
  node or many.

A failure on any rank raises here with that rank's traceback and stops the group (the
other ranks may be blocked in a collective waiting for it).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import socket
import traceback
from multiprocessing.connection import wait

from harness.runtime.settings import RuntimeConfig


class WorkerError(RuntimeError):
    """A worker raised (message: its rank and traceback) or died."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity (what SLURM, taskset or a container grant),
    not the machine's count (os.cpu_count() on a shared 128-core node would oversubscribe it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def worker_threads(threads: int, workers: int) -> int:
    """torch threads per worker: ``runtime.threads`` when > 0, else the cores this process may use, shared out."""
    if threads > 0:
        return int(threads)
    return max(1, usable_cores() // workers)


class InProcessGroup:
    """A single worker living in the driver's process (no copies, no pickling)."""

    size = 1

    def __init__(self, worker_args: tuple):
        from harness.runtime.workers.worker import Worker

        self.worker = Worker(*worker_args)

    def call(self, method: str, args_per_rank: list[tuple]) -> list:
        return [getattr(self.worker, method)(*args_per_rank[0])]

    def close(self) -> None:
        self.worker.close()


def own_process_group() -> None:
    """Make this process the leader of a new process group, which its children (vLLM's engine
    processes) join: ``kill_process_group`` can then reach them even after this process is gone."""
    try:
        os.setpgid(0, 0)
    except OSError:  # already a group or session leader
        pass


def kill_process_group(pgid: int) -> None:
    """SIGKILL what is left of a worker's process group. A worker killed from outside (the kernel's
    OOM killer) leaves its children running, reparented, holding their memory (4.4 GiB measured)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left (or not ours)


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (ids or UUIDs)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def rank_devices(size: int, device: str) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each of ``size`` worker processes: one GPU each on a GPU run, so
    the trainer and every library in the process (vLLM's engine above all, which picks device 0
    of what it sees) use that rank's GPU; None (the environment unchanged) on CPU."""
    if device == "cpu" or (device == "auto" and not visible_gpus()):
        return [None] * size
    gpus = visible_gpus()
    if len(gpus) < size:
        from harness.core.errors import ConfigError

        raise ConfigError(f"runtime.workers={size} needs one GPU per worker process; {len(gpus)} visible "
                          f"({','.join(gpus) or 'none'})")  # fmt: skip
    return gpus[:size]


# Compile caches a worker's vLLM engine fills (vLLM's own, TorchInductor's, Triton's): one set per rank, since
# engines compiling at once into one cache race (vllm-project/vllm#24601).
COMPILE_CACHE_VARS = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def set_rank_compile_caches(rank: int) -> None:
    """This worker process's compile caches under ``$HARNESS_CACHE/compile/rank<R>/`` (setdefault: a value the user
    set stays as it is; the preflight refuses one that several ranks would share)."""
    base = os.path.join(os.path.expanduser(os.environ.get("HARNESS_CACHE") or "~/.cache/harness"), "compile", f"rank{rank}")
    for var, sub in COMPILE_CACHE_VARS.items():
        os.environ.setdefault(var, os.path.join(base, sub))


def _serve(rank: int, world: int, port: int, threads: int, conn, worker_args: tuple,
           worker_cls: str = "harness.runtime.workers.worker:Worker") -> None:  # fmt: skip
    """A ProcessGroup worker: build the Worker, then answer (method, args) until None."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    set_rank_compile_caches(rank)
    import importlib

    import torch
    import torch.distributed as dist

    # The driver handles Ctrl-C and SLURM's SIGTERM (it finishes the step and checkpoints, which
    # needs these workers), then closes the group: the workers and their children ignore them, in a
    # process group of their own that a terminal's Ctrl-C does not reach and close() can kill.
    own_process_group()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch.set_num_threads(threads)
    worker = None
    try:
        module, _, name = worker_cls.partition(":")
        worker = getattr(importlib.import_module(module), name)(*worker_args)
        conn.send(("ok", None))
        while True:
            msg = conn.recv()
            if msg is None:
                break
            method, args = msg
            try:
                conn.send(("ok", getattr(worker, method)(*args)))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass  # the driver went away
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        if worker is not None:
            worker.close()
        if dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def _environ(**values: str | None):
    """``os.environ`` with ``values`` set (None: left as it is) inside the block."""
    saved = {k: os.environ.get(k) for k, v in values.items() if v is not None}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class ProcessGroup:
    """``size`` worker processes on this machine (spawned, so CUDA and vLLM are safe)."""

    def __init__(self, size: int, worker_args: tuple, threads: int, devices: list[str | None] | None = None,
                 worker_cls: str = "harness.runtime.workers.worker:Worker"):  # fmt: skip
        ctx = mp.get_context("spawn")
        port = free_port()
        self.size, self.conns, self.procs = size, [], []
        devices = devices or [None] * size
        for rank in range(size):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(rank, size, port, threads, theirs, worker_args, worker_cls),
                               name=f"harness-worker-{rank}")  # fmt: skip  (not daemonic: vLLM spawns children)
            # The child's environment is this one at start: its GPU is set before anything in it
            # (unpickling the arguments imports torch) can initialise CUDA.
            with _environ(CUDA_VISIBLE_DEVICES=devices[rank]):
                proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)
        atexit.register(self.close)
        self._gather("starting the worker")  # every Worker built (models loaded, process group up)

    def _gather(self, what: str) -> list:
        results: list = [None] * self.size
        pending = dict(enumerate(self.conns))
        sentinels = {p.sentinel: r for r, p in enumerate(self.procs)}
        while pending:
            for ready in wait(list(pending.values()) + list(sentinels)):
                if ready in sentinels:
                    rank = sentinels[ready]
                    if rank in pending and not pending[rank].poll():
                        self.close(wait_s=2)
                        raise WorkerError(f"worker {rank} died ({what}; exit code {self.procs[rank].exitcode})")
                    continue
                rank = next(r for r, c in pending.items() if c is ready)
                status, value = ready.recv()
                del pending[rank]
                if status == "error":
                    self.close(wait_s=2)
                    raise WorkerError(f"worker {rank} failed {what}:\n{value}")
                results[rank] = value
        return results

    def call(self, method: str, args_per_rank: list[tuple]) -> list:
        for conn, args in zip(self.conns, args_per_rank):
            conn.send((method, args))
        return self._gather(f"in {method}")

    def close(self, wait_s: float = 30) -> None:
        """Ask every worker to exit; kill those still running after ``wait_s`` (e.g. blocked
        in a collective with a failed rank)."""
        atexit.unregister(self.close)
        for conn in self.conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=wait_s)
            if proc.is_alive():
                proc.kill()
                proc.join()
            kill_process_group(proc.pid)  # children a dead worker left behind
        self.conns, self.procs = [], []


def check_launcher(rt: RuntimeConfig) -> None:
    """Config checks of ``runtime.launcher`` / ``workers`` / ``ray_address`` / ``fsdp_shard_size`` (called by
    config.validate)."""
    from harness.core.errors import ConfigError

    shard = rt.fsdp_shard_size
    if rt.launcher not in ("local", "ray"):
        raise ConfigError(f"runtime.launcher={rt.launcher!r}: use local or ray")
    if shard < 0 or (shard and rt.workers % shard):
        raise ConfigError(f"runtime.fsdp_shard_size={shard} must divide runtime.workers={rt.workers} (workers per "
                          f"shard group, e.g. the GPUs of a node; 0 = shard over all workers)")  # fmt: skip
    if rt.launcher == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise ConfigError("runtime.launcher=ray needs Ray: pip install 'harness[ray]' (or runtime.launcher=local)")
    elif rt.ray_address:
        raise ConfigError(f"runtime.ray_address={rt.ray_address!r} is set but runtime.launcher=local: add runtime.launcher=ray")
    elif rt.workers > 1 and rt.device != "cpu":
        import torch

        gpus = torch.cuda.device_count()
        if (rt.device == "cuda" or gpus) and rt.workers > gpus:
            raise ConfigError(
                f"runtime.workers={rt.workers} with runtime.launcher=local needs one GPU each, but {gpus} are visible: "
                f"lower runtime.workers, or use runtime.launcher=ray to span nodes"
            )
