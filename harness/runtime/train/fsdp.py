"""Training engine: a Hugging Face causal LM under FSDP2 (``fully_shard``).

gloo on CPU, nccl on GPU; world size 1 runs the very same code path. Holds the
optimizer (AdamW), computes response log-probs/entropy, and performs exact
gradient accumulation over micro-batches (losses are normalised by minibatch totals,
see algorithms.ops.aggregate).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from algorithms.ops import (
    entropy_from_logits,
    logprobs_entropy_chunked,
    logprobs_from_logits,
    replay_kept_set,
)
from harness.core.errors import CheckpointError
from harness.runtime.settings import TrainerConfig
from harness.runtime.train.batching import length_buckets, shared_prompts
from harness.runtime.train.lora import inner_model, trainable_names
from harness.runtime.train.meta_init import fill_shards, is_empty

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def enable_tf32() -> None:
    """TF32 tensor cores for fp32 matmuls and convolutions (Ampere and later): the fp32 master
    weights' ops and fp32 logits run at tensor-core speed, at TF32's 10-bit mantissa inside the
    matmul (accumulation stays fp32). bf16 compute is unaffected."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def init_distributed(device: str) -> None:
    """Join (or, for a single in-process worker, create) the default process group."""
    if dist.is_initialized():
        return
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        enable_tf32()  # one GPU per rank: a worker process sees its own GPU only (workers.rank_devices);
        # under torchrun, which shows every GPU to every rank, LOCAL_RANK picks it
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # launched by torchrun / a worker group
        dist.init_process_group(backend)
    else:  # world size 1 in this process: an in-memory store, no ports
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def device_mesh(device: str, shard_size: int = 0):
    """The ranks' mesh: 1-D (FSDP: every rank holds a shard) or, with ``shard_size`` < world size,
    2-D (replicate, shard) (HSDP: shard within groups of ``shard_size`` consecutive ranks, one node's
    GPUs, replicate across the groups)."""
    world = dist.get_world_size()
    if not shard_size or shard_size >= world:
        return init_device_mesh(device, (world,))
    return init_device_mesh(device, (world // shard_size, shard_size), mesh_dim_names=("replicate", "shard"))


def shard(model: torch.nn.Module, device: str, precision: str, shard_size: int = 0) -> torch.nn.Module:
    """Apply FSDP2 per decoder layer, then at the root (embeddings + head + norm); a 2-D mesh makes
    it HSDP (``runtime.fsdp_shard_size``)."""
    mesh = device_mesh(device, shard_size)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16" else None
    # One rank: resharding after forward frees nothing (the shard is the whole tensor) and
    # would copy the parameters in again for every further forward call and for backward.
    kwargs = {"mesh": mesh, "reshard_after_forward": dist.get_world_size() > 1}
    if mp is not None:
        kwargs["mp_policy"] = mp
    inner = inner_model(model)  # under a peft wrapper: the original model
    layers = getattr(getattr(inner, "model", inner), "layers", [])
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def trim_columns(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> tuple[int, int]:
    """Leading all-padding prompt columns, and response columns up to the last real token (>= 1)."""
    left = int((~prompt_mask).all(0).long().cumprod(0).sum())
    width = int(response_mask.any(0).nonzero().max()) + 1 if response_mask.any() else 1
    return left, width


def response_lengths(response_mask: torch.Tensor) -> torch.Tensor:
    """Per row: columns up to and including its last real response token (0 if none)."""
    columns = torch.arange(1, response_mask.shape[1] + 1, device=response_mask.device)
    return (response_mask.long() * columns).amax(-1) if response_mask.shape[1] else response_mask.sum(-1)


def attention_mask(batch) -> torch.Tensor:
    """The response-span tokens the model reads: an episode's ``context_mask`` (the model's and the
    environment's tokens), else ``response_mask`` (also for a bare ``Generation``)."""
    context = getattr(batch, "context_mask", None)
    return batch.response_mask if context is None else context


def sequence_inputs(prompt_ids, prompt_mask, response_ids, response_mask):
    """Concatenate prompt and response, dropping all-padding columns on both ends.

    Returns input_ids, attention_mask, position_ids, and the column where the
    response starts, plus the number of response columns kept.
    """
    left, width = trim_columns(prompt_mask, response_mask)
    ids = torch.cat([prompt_ids[:, left:], response_ids[:, :width]], 1)
    mask = torch.cat([prompt_mask[:, left:], response_mask[:, :width]], 1)
    # Positions count real tokens only, as generate() does with left padding.
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions, prompt_ids.shape[1] - left, width


def packed_inputs(batch):
    """Every row's real tokens (prompt, then its response span) back to back in one row, no padding.

    Returns ids [1, N], position ids [1, N] restarting at 0 for each sequence (from them the model
    builds a block-diagonal causal mask when no attention mask is given: a sequence never attends
    to another), the packed index of each row's response predictors (position of response token t
    is the one before it) as one flat tensor, and each row's response length."""
    attend = attention_mask(batch)
    lengths = response_lengths(attend)
    ids, predictors, offset = [], [], 0
    for i in range(batch.prompt_ids.shape[0]):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]]
        n = int(lengths[i])
        ids.append(torch.cat([prompt, batch.response_ids[i, :n]]))
        predictors.append(offset + len(prompt) - 1 + torch.arange(n))
        offset += len(prompt) + n
    positions = torch.cat([torch.arange(len(x)) for x in ids])
    return torch.cat(ids)[None], positions[None], torch.cat(predictors), lengths


def _logprobs_entropy(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
                      entropy_grad: bool, kept: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Response log-probs [b, T] (and entropy) of ``logits`` [b, T, V] at ``temperature``.

    Chunked (``logprobs_entropy_chunked``): no [b, T, V] temporaries beside the logits and their
    gradient. An entropy that reaches the loss (an entropy bonus) takes the full autograd graph.
    ``kept`` [b, T] (rollout.mask_replay): the logits are first masked to the rollout's kept sets
    (``replay_kept_set``: one masked [b, T, V] copy of the logits)."""
    if kept is not None:
        logits = replay_kept_set(logits, targets, kept)
    if with_entropy and entropy_grad and torch.is_grad_enabled():
        z = logits.float()
        if temperature and temperature != 1.0:
            z = z / temperature
        return logprobs_from_logits(z, targets), entropy_from_logits(z)
    return logprobs_entropy_chunked(logits, targets, temperature, with_entropy)


class ValueModel(torch.nn.Module):
    """A ``head="scalar"`` role: a causal LM's transformer body with a scalar head (zero-initialised).

    ``self.model`` is the HF backbone (e.g. Qwen2Model), so FSDP wraps its layers
    exactly as it wraps the policy's.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.model = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids, attention_mask, position_ids, use_cache=False):
        hidden = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
        ).last_hidden_state
        # A fresh tensor, not a squeeze view: FSDP2 hooks its backward on the module output.
        return self.value_head(hidden.to(self.value_head.weight.dtype))[..., 0].clone()


class TrainEngine:
    """One FSDP2-wrapped model (the policy or a declared role) and, if trainable, its optimizer.

    ``forward`` returns per-response-token outputs [b, T]: log-probs of the response
    tokens for a causal LM, V(s_t) (the value before token t is generated) for a
    ``ValueModel``.
    """

    def __init__(self, model: torch.nn.Module, device: str, precision: str, optimizer_settings: TrainerConfig | None = None, share_prompts: bool = True,
                 pack: bool = False, checkpointing: bool = False, shard_size: int = 0):  # fmt: skip
        self.device = device
        self.pack = pack  # trainer.pack_sequences: one unpadded row per micro-batch (``_packed``)
        self.precision = precision
        self.is_value_model = isinstance(inner_model(model), ValueModel)
        # HF causal LMs that take ``logits_to_keep`` compute logits for response positions only and
        # can run each distinct prompt once per micro-batch (see ``_logits_shared_prompts``). Both
        # that and length buckets make the number of model calls per forward depend on the data;
        # with several ranks every call is an FSDP collective that must match across ranks, so
        # there a forward is always one call.
        inner = inner_model(model)  # a peft wrapper passes its keywords through
        keeps = not self.is_value_model and "logits_to_keep" in inspect.signature(type(inner).forward).parameters
        one_rank = dist.get_world_size() == 1
        self.logits_to_keep = keeps
        # trainer.gradient_checkpointing: only trained models save activations for a backward. HF turns
        # the KV cache off in checkpointed training forwards, which the shared-prompt pass needs.
        self.checkpointing = bool(checkpointing) and optimizer_settings is not None
        if self.checkpointing:
            body = getattr(inner, "model", inner) if self.is_value_model else inner
            body.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.share_prompts = keeps and share_prompts and one_rank and not self.checkpointing
        self.max_buckets = 4 if one_rank else 1
        if is_empty(model):  # built on the meta device: each rank reads only its shards (meta_init.py)
            self.model = shard(model, device, precision, shard_size)
            fill_shards(self.model, device)
        else:
            self.model = shard(model.to(device), device, precision, shard_size)
        self.optimizer = None
        self.scheduler = None
        # With adapters (LoRA) only some parameters train: the optimizer and checkpoints hold those
        # alone; the frozen rest always comes from the model's starting weights.
        self.trainable = trainable_names(self.model)
        self.partial = optimizer_settings is not None and len(self.trainable) < len(list(self.model.parameters()))
        if optimizer_settings is not None:
            self.model.train()
            self.optimizer = torch.optim.AdamW(
                [p for p in self.model.parameters() if p.requires_grad],
                lr=optimizer_settings.lr,
                betas=tuple(optimizer_settings.betas),
                weight_decay=optimizer_settings.weight_decay,
                fused=device in ("cpu", "cuda"),  # one kernel for all parameters (4x faster on CPU than the loop)
            )
            warmup = max(int(optimizer_settings.warmup_steps), 0)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
            )
            self.grad_clip = float(optimizer_settings.grad_clip)
        else:
            self.model.eval()
            self.model.requires_grad_(False)

    def _autocast(self):
        if self.precision == "bf16":
            return torch.autocast(self.device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def forward(self, batch, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True,
                kept: torch.Tensor | None = None):
        """Log-probs (or values) [b, T], and entropy [b, T] if asked, for ``batch``'s responses.

        ``entropy_grad=False``: the entropy is a metric only, computed without autograd (its
        softmax intermediates are [b, T, vocabulary] each; kept for backward they would
        multiply the forward's peak memory). ``kept`` [b, T] (rollout.mask_replay, the policy only): the
        log-probs of the truncated distributions the rollout sampled from (``replay_kept_set``)."""
        full = batch.response_ids.shape[1]
        if self.pack:
            return self._packed(batch, temperature, with_entropy, entropy_grad, kept)
        if self.is_value_model:
            ids, mask, pos, start, width = sequence_inputs(
                batch.prompt_ids, batch.prompt_mask, batch.response_ids, attention_mask(batch)
            )
            with self._autocast():
                out = self.model(input_ids=ids.to(self.device), attention_mask=mask.long().to(self.device),
                                 position_ids=pos.to(self.device), use_cache=False)
            # Position t's output is about token t+1: the response's predictors start at start-1.
            values = out[:, start - 1 : start - 1 + width].float()
            return torch.nn.functional.pad(values, (0, full - width)), None
        shared = shared_prompts(batch.prompt_ids, batch.prompt_mask) if self.share_prompts else None
        chunks = self._logits_shared_prompts(batch, *shared) if shared is not None else self._logits(batch)
        seen, logps, entropies = [], [], []
        for rows, logits in chunks:  # rows of the batch, logits predicting their first width response tokens
            width = logits.shape[1]
            targets = batch.response_ids[rows, :width].to(self.device)
            rows_kept = None if kept is None else kept[rows, :width]
            logp, entropy = _logprobs_entropy(logits, targets, temperature, with_entropy, entropy_grad, rows_kept)
            pad = (0, full - width)  # back to the batch's response width
            logps.append(torch.nn.functional.pad(logp, pad))
            if with_entropy:
                entropies.append(torch.nn.functional.pad(entropy, pad))
            seen.append(rows)
        back = torch.argsort(torch.cat(seen)).to(self.device)  # bucket order -> batch order
        return torch.cat(logps)[back], (torch.cat(entropies)[back] if with_entropy else None)

    def _packed(self, batch, temperature: float, with_entropy: bool, entropy_grad: bool, kept=None):
        """``forward`` over the micro-batch packed into one unpadded sequence (``packed_inputs``):
        no compute on padding; equal to the padded path up to float rounding (test)."""
        ids, pos, predictors, lengths = packed_inputs(batch)
        dev, full = self.device, batch.response_ids.shape[1]
        with self._autocast():
            if self.is_value_model:
                out = self.model(input_ids=ids.to(dev), attention_mask=None, position_ids=pos.to(dev))
                flat = out[0, predictors.to(dev)].float()
            else:
                keep = {"logits_to_keep": predictors.to(dev)} if self.logits_to_keep else {}
                out = self.model(input_ids=ids.to(dev), attention_mask=None, position_ids=pos.to(dev), use_cache=False, **keep)
                flat = out.logits[0] if keep else out.logits[0, predictors.to(dev)]
        targets = torch.cat([batch.response_ids[i, : int(n)] for i, n in enumerate(lengths)]).to(dev)
        if self.is_value_model:
            values, entropy = flat, None
        else:
            flat_kept = None if kept is None else torch.cat([kept[i, : int(n)] for i, n in enumerate(lengths)])[None]
            values, entropy = _logprobs_entropy(flat[None], targets[None], temperature, with_entropy, entropy_grad,
                                                flat_kept)  # fmt: skip
            values, entropy = values[0], (entropy[0] if with_entropy else None)

        def unflatten(x):  # [N] -> [b, T], each row's response tokens first, zeros after
            rows = torch.split(x, lengths.tolist())
            return torch.stack([torch.nn.functional.pad(r, (0, full - len(r))) for r in rows])

        return unflatten(values), (unflatten(entropy) if entropy is not None else None)

    def _logits(self, batch):
        """Per length bucket: (rows, logits [rows, width, V]) with prompt and response in one pass.

        Attention and positions follow ``attention_mask(batch)``: an episode's environment tokens are
        read like the model's own; only the losses leave them out (``response_mask``)."""
        attend = attention_mask(batch)
        for rows in length_buckets(response_lengths(attend), max_buckets=self.max_buckets):
            ids, mask, pos, start, width = sequence_inputs(
                batch.prompt_ids[rows], batch.prompt_mask[rows], batch.response_ids[rows], attend[rows]
            )
            # Position t's output is about token t+1: the response's predictors are start-1 .. start+width-2,
            # so the last column (it predicts nothing scored) is not run at all.
            ids, mask, pos = ids[:, :-1], mask[:, :-1], pos[:, :-1]
            keep = {"logits_to_keep": torch.arange(start - 1, start - 1 + width)} if self.logits_to_keep else {}
            with self._autocast():
                out = self.model(input_ids=ids.to(self.device), attention_mask=mask.long().to(self.device),
                                 position_ids=pos.to(self.device), use_cache=False, **keep)
            yield rows, (out.logits if keep else out.logits[:, start - 1 : start - 1 + width])

    def _logits_shared_prompts(self, batch, first: torch.Tensor, inverse: torch.Tensor):
        """What ``_logits`` yields, running each distinct prompt once (GRPO-style groups).

        Pass 1 runs the distinct prompts and keeps their KV cache; then, per length bucket,
        pass 2 runs the responses (but their last column, which predicts nothing scored)
        on their prompts' cache rows. Causal attention makes prompt states independent of
        the response, so the outputs equal the one-pass ones and autograd sums each
        prompt's gradient over its samples.
        """
        from transformers import DynamicCache

        attend = attention_mask(batch)  # an episode's environment tokens too
        left, _ = trim_columns(batch.prompt_mask, attend)
        p_ids, p_mask = batch.prompt_ids[first, left:], batch.prompt_mask[first, left:]
        p_pos = (p_mask.long().cumsum(-1) - 1).clamp(min=0)
        dev = self.device
        with self._autocast():
            out = self.model(input_ids=p_ids.to(dev), attention_mask=p_mask.long().to(dev),
                             position_ids=p_pos.to(dev), use_cache=True, logits_to_keep=1)
        prompt_kv = [(k, v) for k, v, *_ in out.past_key_values]
        p_len = p_mask.long().sum(-1)
        inputs_needed = (response_lengths(attend) - 1).clamp(min=0)  # response columns pass 2 runs
        for rows in length_buckets(inputs_needed, max_buckets=self.max_buckets):
            width = int(inputs_needed[rows].max())
            prompt_of, dev_prompt_of = inverse[rows], inverse[rows].to(dev)
            head = out.logits[dev_prompt_of]  # the prompt's last position predicts response token 0
            if width == 0:
                yield rows, head
                continue
            cache = DynamicCache(ddp_cache_data=[(k[dev_prompt_of], v[dev_prompt_of]) for k, v in prompt_kv])
            r_mask = attend[rows, :width]
            mask = torch.cat([p_mask[prompt_of], r_mask], 1)
            pos = p_len[prompt_of, None] + (r_mask.long().cumsum(-1) - 1).clamp(min=0)  # real tokens only, as in one pass
            with self._autocast():
                rest = self.model(input_ids=batch.response_ids[rows, :width].to(dev), attention_mask=mask.long().to(dev),
                                  position_ids=pos.to(dev), past_key_values=cache, use_cache=True)
            yield rows, torch.cat([head, rest.logits], 1)  # response position t predicts token t+1

    def optimizer_step(self) -> float:
        """Clip the global grad norm, step, zero grads; returns the pre-clip norm.

        A non-finite norm (inf/nan gradients: a diverging loss) skips the parameter update, so the
        weights and optimizer moments stay finite; the schedule still advances. The norm is
        global, so every rank skips alike. The caller sees the non-finite norm."""
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm = float(norm)
        if math.isfinite(norm):
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def full_state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """Unsharded weights on CPU, all at once (checkpoints; LoRA's merge). A collective: every rank must
        call it. ``all_ranks=False``: only rank 0 gets them (the others an empty dict). The rollout engine's
        sync takes them one tensor at a time instead (``full_tensors``)."""
        if not all_ranks:
            return get_model_state_dict(self.model, options=_FULL)
        return {k: v.cpu() for k, v in get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True)).items()}

    @torch.no_grad()
    def full_tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The unsharded weights for a rollout engine, one tensor at a time, on CPU (every rank gets each).

        Each shard is cast to ``dtype`` on its device first (a bf16 engine: half the bytes gathered and
        copied), then gathered: a rank holds one gathered tensor beside its shards, never the whole
        model (a 7B model: its largest tensor, the 1.1 GB bf16 embedding, instead of a 30 GB fp32
        gather). A collective: every rank must draw every tensor, in this order. A tied head is its
        embedding and comes once, under the embedding's name.
        """
        seen: set[int] = set()
        for name, value in self.model.state_dict(keep_vars=True).items():
            if id(value) in seen:
                continue
            seen.add(id(value))
            value = value.detach()
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            yield name, (value.full_tensor() if isinstance(value, DTensor) else value).cpu()

    def _sharded_state(self) -> dict:
        """This rank's shards of the trained weights (DTensors, no copy) and of the optimizer's moments."""
        weights = get_model_state_dict(self.model, options=StateDictOptions(ignore_frozen_params=self.partial))
        if self.partial:  # a tied lm_head can come along under its own name although frozen: keep the trained ones
            weights = {k: v for k, v in weights.items() if k in self.trainable}
        out = {"model": weights}
        if self.optimizer is not None:
            out["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)
        return out

    def save_sharded(self, path: str) -> dict:
        """Every rank writes its own shards of the weights and AdamW moments into the directory ``path``
        (torch.distributed.checkpoint): nothing is gathered, so a rank's checkpoint transient is its shards,
        not the model (7B: 91 GB of weights and moments on rank 0 before), and nothing passes through the
        driver or /dev/shm. A collective. Returns what is small and not sharded: the scheduler's state."""
        dcp.save(self._sharded_state(), checkpoint_id=path)
        return {"scheduler": self.scheduler.state_dict()} if self.scheduler is not None else {}

    def load_sharded(self, path: str, small: dict) -> None:
        """Load a ``save_sharded`` directory and its ``small`` part. A collective."""
        if self.partial:  # a missing key would fail deep inside DCP: name the likely cause instead
            saved = {k.removeprefix("model.") for k in dcp.FileSystemReader(path).read_metadata().state_dict_metadata
                     if k.startswith("model.")}  # fmt: skip
            _same_trainable(saved, self.trainable)
        state = self._sharded_state()  # (an empty AdamW gets zero moments first, at lr 0: overwritten below)
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=not self.partial))
        if self.optimizer is not None:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
            self.scheduler.load_state_dict(small["scheduler"])

    def load_state(self, state: dict) -> None:
        """Load a full (gathered) state: checkpoints written before the sharded format. With several ranks, only rank 0's ``state`` needs the tensors
        (others may pass ``{"scheduler": ...}`` alone): they are broadcast from rank 0."""
        many = dist.get_world_size() > 1
        tensors = state.get("model")
        if self.partial and tensors:  # strict=False below must not hide a mismatch
            _same_trainable(set(tensors), self.trainable)
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=many, strict=not self.partial)
        set_model_state_dict(self.model, state.get("model", {}), options=opts)
        if self.optimizer is not None and "scheduler" in state:
            set_optimizer_state_dict(self.model, self.optimizer, state.get("optimizer", {}), options=opts)
            self.scheduler.load_state_dict(state["scheduler"])


def _same_trainable(saved: set[str], trainable: set[str]) -> None:
    if saved != trainable:
        missing, extra = sorted(trainable - saved), sorted(saved - trainable)
        raise CheckpointError(f"the checkpoint's trained parameters do not match this model's (LoRA settings "
                              f"changed?): missing {missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected "
                              f"{extra[:3]}{'...' if len(extra) > 3 else ''}; resume with the run's own model.lora.*")
