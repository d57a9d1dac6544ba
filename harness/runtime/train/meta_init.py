"""Loading a model so that no rank ever holds all of it: built on the meta device, sharded, then each
rank reads only its own rows from the safetensors files (docs/scale.md, per-rank memory).

``from_pretrained`` on every rank puts the full model in each rank's host memory (a 7B fp32 master:
30 GB per rank, 245 GB on an 8-GPU node) and then on its device before ``fully_shard`` splits it.
Here instead:

1. ``empty_causal_lm``: the model's modules with their parameters on the meta device (no memory) and
   their buffers real (rotary tables: small, computed from the config, not stored in checkpoints);
2. ``TrainEngine`` shards it (FSDP2 ``fully_shard`` works on meta parameters);
3. ``fill_shards``: each parameter's local shard is allocated on the rank's device and filled from a
   slice of the checkpoint (safetensors reads only the rows asked for), cast to the master dtype.

A checkpoint that is not safetensors, or whose names are not the model's (a custom architecture with
renamed keys), falls back to the full ``from_pretrained`` load, and the log says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import torch

from harness.runtime.loading import load_causal_lm

log = logging.getLogger(__name__)
WEIGHTS_FROM = "_harness_weights_from"  # on a model built empty: tensor name -> safetensors file to fill it from


@contextlib.contextmanager
def parameters_on_meta():
    """Parameters registered inside land on the meta device; buffers are built for real (what accelerate's
    ``init_empty_weights(include_buffers=False)`` does; accelerate is not a dependency). A layer's
    ``torch.empty`` weight exists for an instant, uninitialised: its pages are never touched."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def checkpoint_names(path: str) -> dict[str, str] | None:
    """Tensor name -> safetensors file of the checkpoint at ``path``; None when it has no safetensors."""
    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        return {name: str(root / file) for name, file in json.loads(index.read_text())["weight_map"].items()}
    single = root / "model.safetensors"
    if not single.is_file():
        return None
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), str(single))


def empty_causal_lm(path: str, dtype: str, trust_remote_code: bool = False) -> torch.nn.Module:
    """``path``'s causal LM with meta parameters, to be filled shard by shard (``fill_shards``) once
    sharded; or, when the checkpoint cannot be read that way, the fully loaded model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    names = checkpoint_names(path) if Path(path).is_dir() else None
    if names is not None:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        with parameters_on_meta():
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
        missing = [n for n, _ in model.named_parameters() if n not in names]
        if not missing:
            setattr(model, WEIGHTS_FROM, names)
            return model
        log.info("model.path=%s: the checkpoint lacks %s (renamed keys?): loading it whole on every rank", path, missing[:3])
    return load_causal_lm(path, dtype, trust_remote_code)


def is_empty(model: torch.nn.Module) -> bool:
    return getattr(model, WEIGHTS_FROM, None) is not None


def empty_like_source(model: torch.nn.Module, source: torch.nn.Module) -> torch.nn.Module:
    """``model`` (built around ``source``'s modules, e.g. a value head on its body) filled from ``source``'s
    checkpoint where ``source`` was built empty; parameters the checkpoint lacks (the head) keep their values."""
    if is_empty(source):
        setattr(model, WEIGHTS_FROM, getattr(source, WEIGHTS_FROM))
    return model


@torch.no_grad()
def fill_shards(model: torch.nn.Module, device: str) -> None:
    """Allocate each (sharded) parameter's local part on ``device`` and read it from the checkpoint:
    only this rank's rows of each tensor are read, at the parameter's dtype."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    names = getattr(model, WEIGHTS_FROM)
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}  # to_empty() discards their values
    # parameters built for real beside the checkpoint's (a value head): their local shards, kept the same way
    built = {n: (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
             for n, p in model.named_parameters() if n not in names}  # fmt: skip
    model.to_empty(device=device)
    for name, buffer in model.named_buffers():
        buffer.copy_(buffers[name])
    files: dict[str, object] = {}
    with contextlib.ExitStack() as stack:
        for name, param in model.named_parameters():
            if name in built:
                (param.to_local() if isinstance(param, DTensor) else param).copy_(built[name])
                continue
            file = names[name]
            if file not in files:
                files[file] = stack.enter_context(safe_open(file, framework="pt"))
            stored = files[file].get_slice(name)
            if isinstance(param, DTensor):
                local = param.to_local()
                shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
            else:
                local, shape, offset = param, tuple(param.shape), (0,) * param.dim()
            index = tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))
            local.copy_(stored[index].to(local.dtype))
    delattr(model, WEIGHTS_FROM)
