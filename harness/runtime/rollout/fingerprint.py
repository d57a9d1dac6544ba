"""Per-tensor fingerprints: did the rollout engine receive every tensor the trainer sent, where it belongs?

One float64 sum over all parameters (the check before this module) cannot see a tensor loaded into
the wrong layer, two rows swapped, or a tensor that was never pushed while the others were: the
total barely moves. Here each sent tensor gets its element count and three numbers, computed chunk
by chunk in float64 (never a float64 copy of the whole tensor: one chunk of ``CHUNK`` elements at a
time):

- ``sum``: sum of the elements;
- ``sumsq``: sum of their squares;
- ``proj``: a projection on fixed pseudo-random weights in [-0.5, 0.5), one per element position,
  from integer arithmetic (the same on every device), so a permutation inside a tensor moves it.

The engine computes the same numbers on what it holds, under the trainer's (HF) names: a
vLLM engine fuses q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj`` (rows stacked in that
order) and pads the vocabulary; ``engine_fingerprints`` undoes both (its caller gives the layout).

``compare`` makes each difference relative: the sum and the projection are divided by
``sqrt(sumsq)`` (the size of a sum of n random-sign terms), the sum of squares by itself. The error
is then 0 when the tensor landed (the same values summed in the same order), below ~1e-12 if the two
sides ever sum in another order (float64 rounding, n up to 1e8), and about ``0.3 * |change| / rms`` when
the engine's tensor differs: an AdamW step at lr 1e-6 moves each element by ~1e-6, about 5e-5 of a
typical 0.02 weight, so a stale tensor shows at ~1e-5, four orders above ``TOLERANCE``.

``stride`` samples (``rollout.verify_sync_stride``): with stride N each tensor's fingerprint reads only the
elements at flat positions 0, N, 2N, ..., both sides alike, so a sync's check costs 1/N of reading every
element (7B at N=64: about 2 s per side at the CPU rate instead of 137). What it still sees: a stale tensor
(an update moves every element), a lost one, one in another layer or of another size; rows swapped inside a
tensor whenever its rows are at least N long (every row then has sampled elements, at positions the
projection weighs differently). What it may miss: a change confined to unsampled elements.

``plant_fault`` is the negative control, on purpose: it drops or swaps tensors *after* they were
fingerprinted, as an engine that loses a push or misroutes a layer would. It is read from
``HARNESS_PLANT_SYNC_FAULT`` by the backends (tests and bench/gpu_check.py set it); never in a real run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

CHUNK = 1 << 20  # elements per float64 chunk: 8 MiB transient
TOLERANCE = 1e-9  # relative; float64 sums of identical values in the same order differ by 0
_MODULUS = 1 << 31
_MULTIPLIER = 1103515245  # odd: position -> weight is one-to-one modulo 2^31
ABSENT = 1.0  # the error of a sent tensor the engine lacks or holds at another size (finite: metrics are JSON)
FAULT_ENV = "HARNESS_PLANT_SYNC_FAULT"

Fingerprint = tuple[int, float, float, float]  # (elements, sum, sum of squares, projection), float64 sums


@torch.no_grad()
def fingerprint(tensor: torch.Tensor, stride: int = 1) -> Fingerprint:
    """``(numel, sum, sumsq, proj)`` of ``tensor``, float64 chunk by chunk (works on views, any device); with
    ``stride`` N > 1 the sums run over the elements at flat positions 0, N, 2N, ... only (numel stays the
    tensor's own, so a tensor of another size still differs)."""
    numel = tensor.numel()
    flat = tensor.detach().reshape(-1)[::stride]  # a view when contiguous; a narrow() of a fused tensor is
    total = squares = projection = 0.0
    for start in range(0, flat.numel(), CHUNK):
        chunk = flat[start : start + CHUNK].to(torch.float64)
        positions = torch.arange(start, start + chunk.numel(), device=chunk.device, dtype=torch.int64) * stride
        weights = ((positions % _MODULUS) * _MULTIPLIER % _MODULUS).to(torch.float64) / _MODULUS - 0.5
        total += float(chunk.sum())
        squares += float(chunk.square().sum())
        projection += float((chunk * weights).sum())
    return numel, total, squares, projection


def fingerprints(named: Iterable[tuple[str, torch.Tensor]], stride: int = 1) -> dict[str, Fingerprint]:
    return {name: fingerprint(t, stride) for name, t in named if t.is_floating_point()}


def engine_fingerprints(model: torch.nn.Module, packed: Mapping[str, list[str]] | None = None,
                        stride: int = 1) -> dict[str, Fingerprint]:  # fmt: skip
    """Fingerprints of ``model``'s parameters under the trainer's names.

    ``packed`` maps a fused module's name to the modules it stacks (vLLM's ``packed_modules_mapping``,
    e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``); the fused module's ``output_sizes`` gives
    each part's rows. A module with ``org_vocab_size`` (vLLM's padded embedding / LM head) counts only
    the vocabulary's rows. Unfused models (``hf``) need neither.
    """
    packed = dict(packed or {})
    modules = dict(model.named_modules())
    out: dict[str, Fingerprint] = {}
    for name, param in model.named_parameters():
        owner, _, leaf = name.rpartition(".")
        module = modules.get(owner)
        prefix, _, short = owner.rpartition(".")
        t = param.detach()
        if short in packed and hasattr(module, "output_sizes"):
            sizes = list(module.output_sizes)
            if sum(sizes) != t.shape[0]:  # a tensor-parallel shard: the harness runs one engine rank per trainer
                raise ValueError(f"{name}: {t.shape[0]} rows, parts {sizes}: tensor-parallel shards are not supported")
            offset = 0
            for part, rows in zip(packed[short], sizes, strict=True):
                out[f"{prefix}.{part}.{leaf}" if prefix else f"{part}.{leaf}"] = fingerprint(t.narrow(0, offset, rows), stride)
                offset += rows
        elif getattr(module, "org_vocab_size", None) is not None and t.shape[0] > module.org_vocab_size:
            out[name] = fingerprint(t.narrow(0, 0, module.org_vocab_size), stride)  # padding rows: never sent
        else:
            out[name] = fingerprint(t, stride)
    return out


@dataclass(frozen=True)
class SyncReport:
    """How the engine's tensors compare with what was sent."""

    max_rel_err: float  # worst relative fingerprint difference over the sent tensors
    mismatched: tuple[str, ...]  # the sent tensors whose fingerprint differs (or that the engine lacks)
    tensors: int  # tensors compared

    def metrics(self) -> dict[str, float]:
        return {"rollout/sync_checksum_rel_err": self.max_rel_err,
                "rollout/sync_mismatched_tensors": float(len(self.mismatched))}  # fmt: skip


def rel_err(sent: Fingerprint, held: Fingerprint) -> float:
    """The largest of the three differences, each relative to a bound on its number (``ABSENT``: sizes differ)."""
    numel, s_sum, s_sq, s_proj = sent
    if held[0] != numel:
        return ABSENT
    scale = math.sqrt(s_sq) or 1.0  # the size of a sum of random-sign terms of this tensor
    return max(abs(held[1] - s_sum) / scale, abs(held[2] - s_sq) / (s_sq or 1.0), abs(held[3] - s_proj) / scale)


def compare(sent: Mapping[str, Fingerprint], held: Mapping[str, Fingerprint], tolerance: float = TOLERANCE) -> SyncReport:
    """Every sent tensor against the engine's; a sent name the engine lacks counts as mismatched."""
    worst, bad = 0.0, []
    for name, fp in sent.items():
        err = rel_err(fp, held[name]) if name in held else ABSENT
        worst = max(worst, err)
        if not err <= tolerance:
            bad.append(name)
    return SyncReport(worst, tuple(bad), len(sent))


def plant_fault(named: list[tuple[str, torch.Tensor]], fault: str | None) -> list[tuple[str, torch.Tensor]]:
    """The negative control (``HARNESS_PLANT_SYNC_FAULT``): ``drop:NAME`` leaves NAME out of the push (a
    lost tensor: the engine keeps the old one); ``swap:A,B`` sends A's tensor as B and B's as A (two
    layers exchanged). Anything else is an error, so a typo cannot plant nothing."""
    if not fault:
        return named
    kind, _, arg = fault.partition(":")
    names = [n for n, _ in named]
    if kind == "drop" and arg in names:
        return [(n, t) for n, t in named if n != arg]
    if kind == "swap" and len(parts := arg.split(",")) == 2 and all(p in names for p in parts):
        a, b = parts
        rename = {a: b, b: a}
        return [(rename.get(n, n), t) for n, t in named]
    raise ValueError(f"{FAULT_ENV}={fault!r}: expected drop:NAME or swap:A,B with names that are sent, "
                     f"e.g. drop:{names[0] if names else 'model.norm.weight'}")  # fmt: skip


def planted_fault() -> str | None:
    return os.environ.get(FAULT_ENV) or None


def push_stream(pairs: Iterable[tuple[str, torch.Tensor]], as_engine: Callable[[str, torch.Tensor], torch.Tensor | None],
                verify: bool, stride: int = 1) -> tuple[Iterable[tuple[str, torch.Tensor]], dict[str, Fingerprint] | None]:  # fmt: skip
    """What a backend's ``load_weights`` pushes: each pair made the engine's by ``as_engine`` (None: not sent),
    fingerprinted as it passes when ``verify`` (rollout.verify_sync, every ``stride``-th element:
    rollout.verify_sync_stride; the dict fills as the stream is drawn),
    then the planted fault, if one is set. Returns (the stream, the fingerprints of what was sent)."""
    prints: dict[str, Fingerprint] | None = {} if verify else None

    def stream():
        for name, tensor in pairs:
            t = as_engine(name, tensor)
            if t is None:
                continue
            if prints is not None and t.is_floating_point():
                prints[name] = fingerprint(t, stride)
            yield name, t

    out = stream()
    if fault := planted_fault():  # the sync check's negative control
        out = plant_fault(list(out), fault)
    return out, prints
