"""Simulated low-precision rollout weights (``rollout.weight_quant``): a rollout-training mismatch dialled on
purpose, as FP8 rollout does in slime/Miles and as an int8 serving engine would. The rollout engine receives
(and starts from) its weight matrices fake-quantized per output channel and dequantized back to its dtype, while
the trainer keeps full precision: the engine samples from a slightly different policy and reports its
log-probs, and the gap is the mismatch the corrections (algorithms/corrections.py) act on.

- ``int8``: symmetric, per output row: scale = max |row| / 127, w -> round(w / scale) * scale (clamped to
  +-127), the round-to-nearest of weight-only int8 (W8A16) quantization;
- ``int4``: the same with 7 steps a side (W4A16 round-to-nearest, no groups): a coarse dial;
- ``int3``: 3 steps a side (W3A16 round-to-nearest, no groups): the strongest dial;
- ``fp8``: per output row scaled so max |row| = 448 (e4m3's largest normal), cast to ``float8_e4m3fn`` and back
  (round to nearest even, 3 mantissa bits), the per-channel scaling of FP8 rollout.

Only the decoder's linear layers (2-D tensors named ``*_proj.weight``) are quantized; embeddings, the LM head,
norms and biases stay exact, as the FP8 recipes leave them. The weights the trainer sends are quantized as they
pass into the engine, so the sync check (``rollout.verify_sync``) compares what the engine holds with what it
was sent, quantized.
"""

from __future__ import annotations

import torch

KINDS = ("none", "int8", "fp8", "int4", "int3")
INT_LEVELS = {"int8": 127.0, "int4": 7.0, "int3": 3.0}  # round-to-nearest steps a side of zero
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def quantized(name: str) -> bool:
    """Whether the tensor ``name`` is one the dial quantizes: a decoder linear layer's weight."""
    return name.endswith("_proj.weight")


@torch.no_grad()
def fake_quantize(tensor: torch.Tensor, kind: str) -> torch.Tensor:
    """``tensor`` [out, in] quantized per output row and dequantized back to its dtype (``kind``: one of KINDS)."""
    if kind == "none" or tensor.dim() != 2 or not tensor.is_floating_point():
        return tensor
    w = tensor.float()
    amax = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
    if kind in INT_LEVELS:
        levels = INT_LEVELS[kind]
        scale = amax / levels
        q = torch.round(w / scale).clamp(-levels, levels) * scale
    elif kind == "fp8":
        scale = amax / FP8_MAX
        q = (w / scale).to(torch.float8_e4m3fn).float() * scale
    else:
        raise ValueError(f"rollout.weight_quant={kind!r}: use {', '.join(KINDS)}")
    return q.to(tensor.dtype)


def quantize_model(model: torch.nn.Module, kind: str) -> None:
    """Fake-quantize ``model``'s decoder linear weights in place (the engine's starting weights)."""
    if kind == "none":
        return
    for name, param in model.named_parameters():
        if quantized(name):
            param.data.copy_(fake_quantize(param.data, kind))
