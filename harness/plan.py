"""``harness plan``: the memory a run will need per process, before it runs.

From the composed config and the model's config.json (no weights are loaded) it adds up, per
training worker process: the FSDP2 shard of the policy's parameters, gradients and AdamW moments
(trainable parameters only: LoRA trains the adapters), the frozen reference and a critic where the
algorithm declares them, the rollout engine's own full copy of the weights (hf) or its process
(vllm: weights + KV cache), the tensor gathered for each weight sync, and the activations of
one training micro-batch: the [sequences, response, vocabulary] logits and their gradient (the
log-probs are computed in chunks, algorithms/ops.py), and each decoder layer's saved tensors
(sdpa's fused kernel keeps no attention probabilities; with ``trainer.gradient_checkpointing`` only
each layer's input and one layer's tensors at a time). Trained parameters are fp32 masters (with
fp32 gradients and moments) whatever ``model.dtype``; gradients are reduce-scattered at every
micro-batch, so they stay sharded. A sync gathers one tensor at a time (with LoRA: the whole state,
and the merged copies of the adapted matrices).
A GPU run whose vLLM engine sleeps needs the larger of two phases: training, or the engine awake
beside the trainer's models and optimizer state. Plus a fixed process overhead (Python, torch,
transformers) measured on this machine.

Every figure is an estimate with stated assumptions: sequences are as long as their caps
(``task.max_prompt_tokens`` + ``rollout.max_response_tokens``), the peak is when training
activations, the weight copies and the optimizer state are all alive. Checked against the dress
rehearsal's measured peak RSS in docs/scale.md (tests/harness/test_plan.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from algorithms.base import Role
from harness.config import Config, runtime_settings
from harness.models import ModelShape, model_shape
from harness.runtime.driver.preflight import Finding, host_needs

GIB = 1024**3
PROCESS_OVERHEAD_GIB = 1.0  # Python + torch + transformers + a tokenizer, measured RSS of an idle worker here
# Saved activations per token per decoder layer for backward, in units of hidden_size and
# intermediate_size floats (Qwen2/Llama block, fp32, no checkpointing): norms, q/k/v/o inputs and
# outputs, rotary copies, the residual stream (~14 x hidden), gate/up/act/product (4 x intermediate).
ACT_HIDDEN, ACT_INTERMEDIATE = 14, 4


LOGP_CHUNK_BYTES = 6 * (1 << 22) * 4  # logprobs_entropy_chunked: a few fp32 temporaries of one 4M-element chunk


def checkpoint_bytes(cfg: Config, params: int) -> int:
    """Bytes of ``model.path``'s safetensors files; an fp32 checkpoint's size when they are not local."""
    path = Path(str(cfg.model.path)).expanduser()
    files = list(path.glob("*.safetensors")) if cfg.model.path != "tiny" and path.is_dir() else []
    return sum(f.stat().st_size for f in files) if files else params * 4


def _matrix_dims(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear layer of a decoder block, by the names LoRA targets."""
    head_dim = shape.hidden // shape.heads
    return {"q_proj": (shape.hidden, shape.heads * head_dim), "k_proj": (shape.hidden, shape.kv_heads * head_dim),
            "v_proj": (shape.hidden, shape.kv_heads * head_dim), "o_proj": (shape.heads * head_dim, shape.hidden),
            "gate_proj": (shape.hidden, shape.intermediate), "up_proj": (shape.hidden, shape.intermediate),
            "down_proj": (shape.intermediate, shape.hidden)}  # fmt: skip


def _adapted_weights(shape: ModelShape, targets: list[str]) -> int:
    """Parameters of the matrices LoRA adapts (the whole-state merge made a copy of each at every sync)."""
    dims = _matrix_dims(shape)
    return shape.layers * sum(dims[t][0] * dims[t][1] for t in targets if t in dims)


def lora_parameters(shape: ModelShape, rank: int, targets: list[str]) -> int:
    """Adapter parameters: r x (in + out) per adapted matrix per layer."""
    dims = _matrix_dims(shape)
    return shape.layers * sum(rank * sum(dims[t]) for t in targets if t in dims)


def plan(cfg: Config, roles: list[Role], shape: ModelShape | None = None, prompt_tokens: int | None = None,
         device_gib: float | None = None) -> dict[str, Any]:
    """Predicted bytes per component of one training worker process (and of a vLLM engine process).

    ``prompt_tokens``: the longest prompt of a micro-batch (default ``task.max_prompt_tokens``, the cap).
    ``device_gib``: the GPU's memory, which a vLLM engine on it takes its ``gpu_memory_utilization`` of."""
    shape = shape or model_shape(cfg)
    workers = max(int(cfg.runtime.workers), 1)
    # FSDP shards over every worker; HSDP (runtime.fsdp_shard_size=N) over groups of N, replicated across them
    shards = min(int(cfg.runtime.fsdp_shard_size) or workers, workers)
    weight_bytes = 2 if cfg.model.dtype == "bfloat16" else 4
    params = shape.parameters
    lora_rank = int(cfg.model.lora.rank)
    trainable = lora_parameters(shape, lora_rank, list(cfg.model.lora.target_modules)) if lora_rank else params
    seqs_per_step = int(cfg.trainer.prompts_per_step) * int(cfg.algo.samples_per_prompt)
    micro = min(int(cfg.trainer.micro_batch_sequences), max(seqs_per_step // workers, 1))
    response = int(cfg.rollout.max_response_tokens)
    length = int(prompt_tokens or cfg.task.max_prompt_tokens) + response
    checkpoint = checkpoint_bytes(cfg, params)  # reads model.path's file sizes once
    from harness.runtime.driver.pipeline import pipelined
    from harness.runtime.rollout import BackendMemory, MemoryFacts, backend_name, get_backend

    settings = runtime_settings(cfg).rollout
    backend = backend_name(settings)  # the rollout backend's own terms (harness/runtime/rollout/)
    memory = get_backend(backend).memory
    facts = MemoryFacts(params, weight_bytes, checkpoint, str(cfg.runtime.device), device_gib,
                        pipelined(cfg.trainer.pipeline, cfg.trainer.max_staleness), settings)
    rollout = memory(facts) if memory is not None else BackendMemory()  # a plugin that states none
    per = {}
    # Trained parameters are fp32 masters whatever model.dtype (bf16 compute: harness/runtime/workers/worker.py);
    # peft keeps adapters in fp32 over a frozen base at model.dtype. Gradients and moments are fp32 too.
    per["parameters (policy, FSDP shard)"] = params * (weight_bytes if lora_rank else 4) / shards
    per["gradients"] = trainable * 4 / shards  # reduce-scattered at every micro-batch's backward: never unsharded
    per["optimizer (AdamW moments)"] = 2 * trainable * 4 / shards
    for role in roles:
        if role.head == "lm" and not role.trainable:
            if lora_rank and role.init == "policy":
                continue  # the policy with its adapters off: no copy
            if role.init == "policy":
                per[f"{role.name} (frozen copy)"] = params * weight_bytes / shards
            else:  # another model (e.g. a frozen teacher): its own size, at model.dtype
                per[f"{role.name} (frozen, {role.init})"] = model_shape(cfg, role.init).parameters * weight_bytes / shards
        else:
            body = params - shape.vocab * shape.hidden * (0 if shape.tied else 1)  # a scalar head: no LM head
            if lora_rank and role.trainable and role.name in cfg.model.lora.roles:  # frozen body, fp32 adapters
                adapters = lora_parameters(shape, lora_rank, list(cfg.model.lora.target_modules))
                per[f"{role.name} (frozen, LoRA adapters trained)"] = (body * weight_bytes + adapters * 16) / shards
                continue
            # trained: fp32 parameters, gradients and two moments; frozen: one copy at model.dtype
            per[f"{role.name} ({'trained' if role.trainable else 'frozen'})"] = body * (16 if role.trainable else weight_bytes) / shards
    per |= rollout.worker  # a colocated engine in the worker's process (hf: its own copy of the weights)
    if lora_rank:  # the whole state gathered at once (at model.dtype) and fp32 merged copies of the adapted matrices:
        # what the LoRA sync held until 2026-12-07, and what the rehearsals that calibrate these terms measured
        # (tests/harness/test_plan.py). The sync now merges one gathered matrix at a time (lora.merged_stream), so
        # these two terms are an upper bound until the rehearsals are re-run.
        per["weight sync (gathered full state)"] = params * weight_bytes
        per["weight sync (LoRA-merged matrices)"] = _adapted_weights(shape, list(cfg.model.lora.target_modules)) * 4
    else:  # one tensor at a time (TrainEngine.full_tensors): the largest, cast to the engine's dtype, then gathered
        per["weight sync (largest gathered tensor)"] = max(shape.vocab, shape.intermediate) * shape.hidden * rollout.sync_weight_bytes
    # bf16 weights or autocast give bf16 logits; the chunked log-prob (algorithms/ops.py) adds their gradient
    # and ~0.1 GiB of per-chunk temporaries, never a [sequences, response, vocabulary] fp32 copy
    logit_bytes = 2 if cfg.model.dtype == "bfloat16" or cfg.trainer.precision == "bf16" else 4
    per["logits (one micro-batch) and their gradient"] = 2 * micro * response * shape.vocab * logit_bytes + LOGP_CHUNK_BYTES
    if float(getattr(cfg.algo, "entropy_coef", 0.0) or 0.0):  # an entropy bonus differentiates the full softmax
        per["entropy bonus (fp32 softmax graph of one micro-batch)"] = 3 * micro * response * shape.vocab * 4
    # bf16 autocast (trainer.precision=bf16, or full fine-tuning with model.dtype=bfloat16) keeps bf16
    # activations; a bf16 base under fp32 adapters measured closer to fp32 (the vLLM rehearsal, test_plan)
    bf16_compute = cfg.trainer.precision == "bf16" or (cfg.model.dtype == "bfloat16" and not lora_rank)
    act_bytes = 2 if bf16_compute else 4
    layer_bytes = micro * length * act_bytes * (ACT_HIDDEN * shape.hidden + ACT_INTERMEDIATE * shape.intermediate)
    if cfg.trainer.gradient_checkpointing:
        # each layer keeps its input; backward recomputes one layer's activations at a time
        per["layer activations (checkpointed: layer inputs + one layer)"] = (
            micro * length * act_bytes * shape.hidden * shape.layers + layer_bytes)
    else:
        per["layer activations (one micro-batch)"] = layer_bytes * shape.layers
    if shards > 1:  # FSDP2 gathers what each forward and backward uses: nothing of it is kept between updates
        # The root module's parameters (embeddings, LM head, final norm) stay gathered from the first forward to the
        # end of backward; each decoder layer is gathered in turn, the next one prefetched; a gradient is
        # reduce-scattered from a full-size fp32 input (reduce_dtype), the root's the largest. Measured on CPU as
        # one rank of 8 and 16 (bench/bench_fake_ranks.py, docs/scale.md): absent, the plan was 37% under at 1.5B.
        # (gathered at the compute dtype: bf16 under trainer.precision=bf16, else as stored: fp32 masters, or a
        # LoRA base at model.dtype, whose frozen root has no gradient to reduce)
        gathered_bytes = 2 if cfg.trainer.precision == "bf16" else (weight_bytes if lora_rank else 4)
        root = shape.vocab * shape.hidden * (1 if shape.tied else 2) + shape.hidden
        layer = (params - root) / max(shape.layers, 1)
        per["FSDP gathered root (embeddings, LM head, norm)"] = root * gathered_bytes
        per["FSDP gathered layers (one, and the next prefetched)"] = 2 * layer * gathered_bytes
        if not lora_rank:
            per["FSDP reduce-scatter input (the root's full fp32 gradient)"] = root * 4
    per["process overhead"] = PROCESS_OVERHEAD_GIB * GIB
    total = sum(per.values())
    # What stays allocated while the rollout engine runs (between updates): the models and the optimizer
    # state. Gradients, logits, activations and the gathered state are freed, and their cached blocks
    # released (harness/runtime/rollout/vllm.py release_cached_memory) before vLLM is built or woken.
    transient = ("gradients", "logits", "layer activations", "entropy bonus", "weight sync", "FSDP")
    persistent = sum(v for k, v in per.items() if not k.startswith(transient))
    out: dict[str, Any] = {"model_parameters": params, "trainable_parameters": trainable, "workers": workers,
                           "micro_batch_sequences": micro, "sequence_tokens": length,
                           "worker_bytes": per, "worker_total_bytes": total,
                           "worker_persistent_bytes": persistent}  # fmt: skip
    if rollout.engine:  # an engine process of its own (vllm); with sleep mode the peaks do not add up
        out |= {"rollout_backend": backend, "engine_bytes": rollout.engine, "engine_sleeps": rollout.sleeps}
    if str(cfg.runtime.device) != "cpu":  # on CPU every term above is host memory already
        out["host_bytes"] = host_needs(runtime_settings(cfg), params)  # what the GPU preflight checks (check_host_memory)
    return out


def render(result: dict[str, Any], device_gib: float | None) -> str:
    """The plan as text, one component per line, and whether it fits ``device_gib``."""
    lines = [f"model: {result['model_parameters'] / 1e6:.1f}M parameters, {result['trainable_parameters'] / 1e6:.2f}M "
             f"trained; {result['workers']} worker(s); micro-batch {result['micro_batch_sequences']} x "
             f"{result['sequence_tokens']} tokens", "", "per training worker process:"]  # fmt: skip
    for name, value in result["worker_bytes"].items():
        lines.append(f"  {value / GIB:8.2f} GiB  {name}")
    total = result["worker_total_bytes"]
    lines.append(f"  {total / GIB:8.2f} GiB  total (peak estimate)")
    engine = result.get("engine_bytes")
    if engine:
        lines += ["", f"per {result['rollout_backend']} engine process:"] + [f"  {v / GIB:8.2f} GiB  {k}" for k, v in engine.items()]
        lines.append(f"  {sum(engine.values()) / GIB:8.2f} GiB  total")
    host = result.get("host_bytes")
    if host:
        lines += ["", "host memory on this machine (every local worker; the GPU preflight refuses a run without it):"]
        lines += [f"  {v / GIB:8.2f} GiB  {k}" for k, v in host.items()]
        lines.append(f"  {sum(host.values()) / GIB:8.2f} GiB  total")
    if device_gib:
        need, how = device_need(result)
        verdict = "fits" if need <= device_gib * GIB else "does NOT fit"
        lines += ["", f"{verdict} in {device_gib:g} GiB per device ({need / GIB:.2f} GiB needed per worker ({how}))"]
    return "\n".join(lines)


def device_need(result: dict[str, Any]) -> tuple[float, str]:
    """Bytes one device must hold for this plan, and how they add up. A vLLM engine that sleeps while the trainer
    runs (GPU sleep mode) makes the need the larger of two phases: training, or the engine awake beside what the
    trainer keeps (models, optimizer state); an engine that never sleeps adds to the training peak."""
    total, kept = result["worker_total_bytes"], result["worker_persistent_bytes"]
    engine = sum(result.get("engine_bytes", {}).values())
    if not engine:
        return total, f"training peak {total / GIB:.2f} GiB"
    backend = result["rollout_backend"]
    if result.get("engine_sleeps"):
        awake = engine + kept
        phase = "the engine awake" if awake >= total else "training"
        return max(total, awake), (f"{phase} is the larger phase: {backend} engine {engine / GIB:.2f} GiB awake beside "
                                   f"the trainer's {kept / GIB:.2f} GiB of models and optimizer state; training peak "
                                   f"{total / GIB:.2f} GiB while it sleeps")  # fmt: skip
    return total + engine, f"training peak {total / GIB:.2f} GiB + {backend} engine {engine / GIB:.2f} GiB"


def check_device_memory(cfg: Config, roles: list[Role], device_bytes: int | None) -> Finding:
    """The GPU preflight's plan check: refuse, before any model is loaded, a run whose planned memory per worker
    (the trainer's, plus the vLLM engine's share of the device) exceeds the device's, in one line with both numbers
    and the knob to turn; vLLM's own start-up check would otherwise fail only after the trainer is built."""
    if not device_bytes:
        return Finding("info", "device_memory", "not checked (the device's memory is unknown)")
    try:
        result = plan(cfg, roles, device_gib=device_bytes / GIB)
    except FileNotFoundError:  # no local config.json for model.path
        return Finding("info", "device_memory", "not checked (model.path has no local config.json to plan from)")
    need, how = device_need(result)
    have = f"the device has {device_bytes / GIB:.1f} GiB"
    if need <= device_bytes:
        return Finding("ok", "device_memory", f"`harness plan` needs {need / GIB:.1f} GiB per worker, {have} ({how})")
    beside = result["worker_persistent_bytes"] if result.get("engine_sleeps") else result["worker_total_bytes"]
    if result.get("engine_bytes") and need > result["worker_total_bytes"] and beside < device_bytes:
        # the engine's share is what overflows, and a smaller one would fit
        knob = (f"lower rollout.vllm.gpu_memory_utilization (now {cfg.rollout.vllm.gpu_memory_utilization:g}) to at "
                f"most {max(device_bytes - beside, 0) / device_bytes:.2f}, or shard the "
                "trainer over more workers (runtime.workers)")  # fmt: skip
    else:
        knob = ("lower trainer.micro_batch_sequences, set trainer.gradient_checkpointing=true, shard over more workers "
                "(runtime.workers), or train LoRA adapters (model.lora.rank)")  # fmt: skip
    return Finding("fail", "device_memory", f"`harness plan` needs {need / GIB:.1f} GiB per worker, {have} ({how}): "
                   f"{knob}")  # fmt: skip
