"""Rollout backends (base.py: the protocol, ``Generation``, the registry; hf.py, vllm.py, remote.py: the built-ins)."""

from harness.runtime.rollout.base import (
    BackendMemory,
    BackendSpec,
    Generation,
    MemoryFacts,
    RolloutBackend,
    RolloutContext,
    backend_name,
    build_backend,
    get_backend,
    register_backend,
    registered_backends,
)

__all__ = ["BackendMemory", "BackendSpec", "Generation", "MemoryFacts", "RolloutBackend", "RolloutContext",
           "backend_name", "build_backend", "get_backend", "register_backend", "registered_backends"]
