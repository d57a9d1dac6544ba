"""Worker processes that can be abandoned: the hard time bound of the checkers.

A check that overruns its limit cannot be interrupted inside the process that
runs it (sympy does not poll for cancellation, and threads cannot be killed),
so anything without a bound by construction runs in a worker process.  A
worker that overruns is killed and replaced; the training process only sees a
``"timeout"`` result.

Workers come from the ``forkserver`` start method (``spawn`` where that is
missing): they never inherit the trainer's threads, CUDA state or locks.  The
forkserver preloads sympy and the checkers once, so replacing a killed worker
takes milliseconds.  All pools are closed at interpreter exit.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import weakref
from multiprocessing.connection import wait

STARTUP_TIMEOUT = 120.0  # first start imports sympy; not charged to any check
MEMORY_LIMIT = 4 << 30  # bytes of address space per worker

IN_WORKER = False  # set in worker processes: they run the symbolic layer in-process
_PRELOAD = ["rewards._equiv", "rewards._sympy_bridge", "rewards.math", "rewards.gsm8k", "sympy"]
_POOLS: weakref.WeakSet = weakref.WeakSet()


def _worker_main(conn) -> None:
    global IN_WORKER
    IN_WORKER = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):
        pass
    conn.send(("ready", os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, items = msg
        for idx, args in items:
            try:
                out = ("ok", fn(*args))
            except BaseException as exc:  # noqa: B036 - report, never die silently
                out = ("error", f"{type(exc).__name__}")
            conn.send((idx, out))


def _context():
    methods = mp.get_all_start_methods()
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return mp.get_context("spawn")


@contextlib.contextmanager
def _hide_main_module():
    """Start workers without re-importing the parent's ``__main__``.

    ``spawn``/``forkserver`` children re-run the main script (a trainer that
    imports torch, or "<stdin>", which cannot be re-run); our workers need none
    of it, so the main module's file and spec are hidden while a worker starts.
    """
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if main is not None and hasattr(main, k)}
    try:
        for k in saved:
            if k == "__spec__":
                main.__spec__ = None
            else:
                delattr(main, k)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="rewards-worker")
        with _hide_main_module():
            self.proc.start()
        child.close()
        self.ready = False

    def wait_ready(self, timeout: float) -> bool:
        if not self.ready and self.conn.poll(timeout):
            try:
                self.ready = self.conn.recv()[0] == "ready"
            except (EOFError, OSError):
                return False
        return self.ready

    def kill(self) -> None:
        try:
            self.conn.close()
        except OSError:
            pass
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)


class WorkerPool:
    """A few killable worker processes; ``map`` and ``call`` with per-item time limits."""

    def __init__(self, size: int):
        self.size = max(1, size)
        self._ctx = None
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.killed = 0  # workers abandoned for overrunning (for logs/tests)
        _POOLS.add(self)

    # -- lifecycle
    def _new_worker(self) -> _Worker:
        if self._ctx is None:
            self._ctx = _context()
        return _Worker(self._ctx)

    def _take(self, n: int) -> list[_Worker]:
        """n ready workers (starting new ones as needed)."""
        workers = self._idle[:n]
        del self._idle[:n]
        workers += [self._new_worker() for _ in range(n - len(workers))]
        ready = [w for w in workers if w.wait_ready(STARTUP_TIMEOUT)]
        for w in workers:
            if w not in ready:
                w.kill()
        if not ready:
            raise RuntimeError("no worker process could start")
        return ready

    def close(self) -> None:
        with self._lock:
            for w in self._idle:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
                w.kill()
            self._idle = []

    # -- work
    def call(self, fn, args: tuple, timeout: float):
        """Run ``fn(*args)`` in a worker: ("ok", value) | ("timeout", None) | ("error", name)."""
        return self.map(fn, [args], timeout, chunk=1)[0]

    def map(self, fn, arg_list: list[tuple], timeout: float, chunk: int = 16) -> list:
        """``fn(*args)`` for each args in parallel; an item over ``timeout`` s gets ("timeout", None)."""
        with self._lock:
            return self._map(fn, arg_list, timeout, chunk)

    def _map(self, fn, arg_list, timeout, chunk):
        n = len(arg_list)
        results: list = [None] * n
        items = list(enumerate(arg_list))
        pending = collections.deque(items[i: i + chunk] for i in range(0, n, chunk))
        idle = self._take(min(self.size, len(pending)))
        busy: dict[_Worker, list] = {}  # worker -> [chunk, position, time of last progress]
        while pending or busy:
            while idle and pending:
                w, work = idle.pop(), pending.popleft()
                try:
                    w.conn.send((fn, work))
                except OSError:
                    pending.appendleft(work)
                    w.kill()
                    idle += self._take(1)
                    continue
                busy[w] = [work, 0, time.monotonic()]
            for conn in wait([w.conn for w in busy], timeout=min(0.05, timeout)):
                w = next(x for x in busy if x.conn is conn)
                state = busy[w]
                try:
                    idx, out = conn.recv()
                except (EOFError, OSError):  # the worker died (e.g. out of memory)
                    self._abandon(w, state, busy, pending, idle, ("error", "WorkerDied"), results)
                    continue
                results[idx] = out
                state[1] += 1
                state[2] = time.monotonic()
                if state[1] == len(state[0]):
                    del busy[w]
                    idle.append(w)
            now = time.monotonic()
            for w, state in list(busy.items()):
                if now - state[2] > timeout:
                    self._abandon(w, state, busy, pending, idle, ("timeout", None), results)
        self._idle.extend(idle)
        return results

    def _abandon(self, w, state, busy, pending, idle, outcome, results) -> None:
        work, pos, _ = state
        results[work[pos][0]] = outcome
        if pos + 1 < len(work):
            pending.appendleft(work[pos + 1:])
        del busy[w]
        w.kill()
        self.killed += 1
        idle.extend(self._take(1))


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close()


_SHARED: WorkerPool | None = None
_SHARED_LOCK = threading.Lock()


def shared_pool() -> WorkerPool:
    """The process-wide pool used by every checker (sized to the machine, at most 4)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            size = int(os.environ.get("REWARDS_WORKERS", min(4, os.cpu_count() or 1)))
            _SHARED = WorkerPool(size)
        return _SHARED
