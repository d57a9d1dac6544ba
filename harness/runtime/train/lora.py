"""LoRA: low-rank adapters on a role's linear layers (peft), merged for the rollout engine.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3): a frozen
weight W0 [out, in] gets a trainable update (alpha / r) * B A with A [r, in] and B [out, r]
(B starts at zero, so training starts exactly at W0). Only A and B are trained and held by the
optimizer. The frozen base is the KL reference for free: the same model with the adapters switched
off, so no second copy of the weights exists.

The rollout engine receives merged weights, W0 + (alpha / r) B A, under the base model's own
parameter names; a checkpoint keeps only the adapters (peft's format), the export a merged model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from harness.runtime.settings import LoraConfig

# peft's names inside a wrapped model: <module>.base_layer.weight (W0), <module>.lora_A.<adapter>.weight ...
ADAPTER = "default"
_WRAP = "base_model.model."  # PeftModel -> LoraModel -> the original module
LINEAR_EXAMPLE = ("q_proj", "v_proj", "down_proj")


def enabled(lora: LoraConfig) -> bool:
    """``model.lora.rank > 0``: LoRA on; 0: full fine-tuning."""
    return lora is not None and int(lora.rank) > 0


def scaling(lora: LoraConfig) -> float:
    return float(lora.alpha) / int(lora.rank)


def peft_config(lora: LoraConfig, **extra: Any):
    """peft's LoraConfig for ``model.lora`` settings."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=int(lora.rank), lora_alpha=float(lora.alpha), lora_dropout=float(lora.dropout),
                      target_modules=sorted(lora.target_modules), bias="none", **extra)


def add_adapters(model: torch.nn.Module, lora: LoraConfig, trainable_too: tuple[str, ...] = ()) -> torch.nn.Module:
    """``model`` wrapped by peft with fresh adapters on ``lora.target_modules``; every other
    parameter frozen except those whose name contains one of ``trainable_too`` (a value head)."""
    from peft import get_peft_model

    config = peft_config(lora)
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as exc:  # no module matched target_modules
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"model.lora.target_modules={list(lora.target_modules)} matches no layer of this model "
                         f"({exc}); its linear layers are named {names}") from None
    from peft.tuners.tuners_utils import BaseTunerLayer

    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    for name, module in wrapped.named_modules():
        if not isinstance(module, BaseTunerLayer):
            continue
        base = module.get_base_layer()
        # The merge (W0 + s B A on [out, in] weights) is exact for untied nn.Linear layers only:
        # embeddings, GPT-2's Conv1D ([in, out]) and a tied lm_head would not sync to the engine.
        if type(base) is not torch.nn.Linear or (tied and name.endswith("lm_head")):
            raise ValueError(f"model.lora.target_modules: {name} is a {type(base).__name__}"
                             f"{' tied to the embedding' if tied and name.endswith('lm_head') else ''}; "
                             f"LoRA here adapts untied nn.Linear projections only (e.g. {', '.join(LINEAR_EXAMPLE)})")
    for name, param in wrapped.named_parameters():
        if any(t in name for t in trainable_too):
            param.requires_grad_(True)
    return wrapped


def inner_model(model: torch.nn.Module) -> torch.nn.Module:
    """The original module under a peft wrapper (itself when not wrapped)."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) else model


@contextlib.contextmanager
def adapters_off(model: torch.nn.Module):
    """Run ``model`` as its base (every adapter bypassed) inside the block.

    peft's own ``disable_adapter()`` also flips the adapters' ``requires_grad`` off and on, which
    FSDP2 does not see (its sharded parameters keep the flags they had when sharded), so the
    adapters would silently stop training: only the layers' bypass flag is switched here.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def trainable_names(model: torch.nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (of the unsharded model)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def merged(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A peft-wrapped model's full state dict -> the base model's, adapters merged in
    (``<m>.base_layer.weight`` becomes ``<m>.weight`` = W0 + scale * B A; the wrapper's prefix goes)."""
    base = {k.removeprefix(_WRAP).replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}
    return merge_adapters(base, adapter_only(state), scale)


def merged_stream(pairs: Iterable[tuple[str, torch.Tensor]], scale: float) -> Iterator[tuple[str, torch.Tensor]]:
    """``merged`` one tensor at a time, for a sync that never holds the model: a peft-wrapped model's
    ``(name, tensor)`` pairs in its state-dict order (``TrainEngine.full_tensors``: each gathered as it is drawn)
    -> the base model's, each adapted ``<m>.weight`` = W0 + scale * B A in float32 yielded as soon as its W0, A
    and B have passed (peft registers them one after another), every other tensor as it comes. A rank so holds
    one adapted matrix and its adapters beside what it is sending, not the whole state (7B: ~40 GB per rank)."""
    waiting: dict[str, dict[str, torch.Tensor]] = {}  # module -> its W0, A and B seen so far
    for key, value in pairs:
        name = key.removeprefix(_WRAP)
        if ".lora_" in name:
            for part in ("A", "B"):
                if f".lora_{part}.{ADAPTER}." in name:
                    module = name.split(f".lora_{part}.")[0]
                    break
            else:
                raise ValueError(f"adapter tensor {key} is not a LoRA A/B matrix of a linear layer: cannot merge it")
        elif name.endswith(".base_layer.weight"):
            module, part = name.removesuffix(".base_layer.weight"), "W0"
        else:
            yield name.replace(".base_layer.", "."), value  # a bias of an adapted layer, or an unadapted tensor
            continue
        held = waiting.setdefault(module, {})
        held[part] = value
        if len(held) == 3:
            del waiting[module]
            yield f"{module}.weight", held["W0"].float() + (held["B"].float() @ held["A"].float()) * scale
    if waiting:
        raise ValueError(f"LoRA merge: {sorted(waiting)[:3]} lack a base weight or an adapter matrix "
                         f"(have {sorted(next(iter(waiting.values())))})")  # fmt: skip


def merge_adapters(base: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """``base`` (the model's own parameter names) with each adapted weight replaced by
    W0 + scale * B A in float32 (not rounded back to a bf16 W0: an update smaller than half a bf16
    step would vanish; the receiving engine casts to its own dtype)."""
    out = dict(base)
    for key in adapters:
        if f".lora_A.{ADAPTER}." not in key and f".lora_B.{ADAPTER}." not in key:
            raise ValueError(f"adapter tensor {key} is not a LoRA A/B matrix of a linear layer: cannot merge it")
    for key, a in adapters.items():
        if f".lora_A.{ADAPTER}." not in key:
            continue
        module = key.removeprefix(_WRAP).split(".lora_A.")[0]
        b = adapters[key.replace(".lora_A.", ".lora_B.")]
        w0 = out[f"{module}.weight"]
        out[f"{module}.weight"] = w0.float() + (b.float() @ a.float()) * scale
    return out


def adapter_only(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if ".lora_" in k}


def save_adapter(adapters: dict[str, torch.Tensor], lora: LoraConfig, base_path: str, out_dir: str | Path) -> None:
    """Write adapters in peft's format (adapter_config.json + adapter_model.safetensors), which
    ``peft.PeftModel.from_pretrained(base, out_dir)`` loads."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # peft's files leave the adapter name out of the keys: ...lora_A.weight
    tensors = {k.replace(f".{ADAPTER}.", "."): v.contiguous() for k, v in adapters.items()}
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    peft_config(lora, task_type="CAUSAL_LM", base_model_name_or_path=str(base_path),
                inference_mode=True).save_pretrained(str(out))


def describe(lora: LoraConfig) -> dict[str, Any]:
    """The settings a report shows beside each row."""
    if not enabled(lora):
        return {"tuning": "full"}
    return {"tuning": "lora", "rank": int(lora.rank), "alpha": float(lora.alpha), "dropout": float(lora.dropout),
            "target_modules": sorted(lora.target_modules), "roles": sorted(lora.roles)}  # fmt: skip
