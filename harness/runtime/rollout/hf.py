"""Rollout backend ``hf``: transformers ``generate`` with KV cache (the CPU default).

The backend owns its own copy of the model; ``load_weights`` receives the trained
weights after every update (the same hand-over a vLLM engine gets).

Seeds: ``generate(..., seeds=[s_0, s_1, ...])`` gives sample j of prompt i its own random
stream, seeded with ``s_i + j`` (the scheme vLLM uses for per-request seeds), so what a
prompt gets does not depend on which other prompts share the call -- the property that
makes rollouts independent of how prompts are split across workers.
"""

from __future__ import annotations

import inspect

import torch

from harness.runtime.loading import load_causal_lm
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
    response_mask_from_ids,
)
from harness.runtime.rollout.fingerprint import Fingerprint, fingerprints, push_stream
from harness.runtime.rollout.quant import fake_quantize, quantize_model, quantized


class SeededGumbelSampler:
    """Sampling by the Gumbel-max trick with one RNG stream per row.

    argmax(log p + G), G ~ Gumbel(0, 1) i.i.d. per token, is an exact sample from p
    (Gumbel 1954; Maddison et al. 2014, arXiv:1411.0030). Used as the last logits
    processor of a *greedy* ``generate``, after temperature/top-p, it samples each row
    from its own ``torch.Generator``: rows never share random numbers, whatever the batch.
    """

    def __init__(self, row_seeds: list[int], device):
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in row_seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        vocab, dev = scores.shape[-1], scores.device
        u = torch.stack([torch.rand(vocab, generator=g, device=dev) for g in self.generators])
        tiny = torch.finfo(u.dtype).tiny
        gumbel = -torch.log(-torch.log(u.clamp(min=tiny, max=1.0 - 1e-7)))
        return scores.float() + gumbel


class SampledLogprobs:
    """Records the log-prob of every sampled token, holding one step's [rows, vocabulary] at a time. Put
    first among the logits processors: it sees the raw logits and returns them unchanged; the token a
    step sampled is the last column of the next call's ``input_ids`` (the final step's: of the returned
    sequences, ``finish``).

    It records, per token, under the distribution the token was sampled from: softmax(z / T) cut by
    top-k then top-p (the sampler's own warpers, in generate's order) and renormalised over the kept set
    K, log p(y) - log Z with Z the kept mass (what vLLM's processed log-probs are); and |K|, the number
    of tokens kept (``rollout.mask_replay``: the trainer masks its logits to its |K| highest, so its
    ratio to these log-probs is 1 on a synchronous run; without replay the ratio to its full softmax is
    Z <= 1, the bias of TRL#6789). With neither top-p nor top-k, K is the vocabulary and |K| is recorded
    as 0 (nothing cut).
    """

    def __init__(self, temperature: float, top_p: float = 1.0, top_k: int = 0):
        from transformers import TopKLogitsWarper, TopPLogitsWarper

        self.temperature = temperature
        self.cuts = ([TopKLogitsWarper(top_k)] if top_k > 0 else []) + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
        self.pending: torch.Tensor | None = None
        self.pending_kept: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []
        self.kept: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1:])
        z = scores.float() / self.temperature
        for cut in self.cuts:
            z = cut(input_ids, z)
        self.pending = torch.log_softmax(z, -1)
        self.pending_kept = torch.isfinite(z).sum(-1, dtype=torch.int32) if self.cuts else None
        return scores

    def _take(self, sampled: torch.Tensor) -> None:
        if self.pending is None:
            return
        self.steps.append(self.pending.gather(-1, sampled.to(self.pending.device)).squeeze(-1).cpu())
        if self.pending_kept is not None:
            self.kept.append(self.pending_kept.cpu())

    def finish(self, sequences: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[rows, generated tokens] log-probs (the same width as the generated part of ``sequences``), and the
        kept sets' sizes (None without top-p or top-k)."""
        self._take(sequences[:, -1:])
        self.pending = self.pending_kept = None
        rows = sequences.shape[0]
        logp = torch.stack(self.steps, 1) if self.steps else torch.zeros(rows, 0)
        if not self.cuts:
            return logp, None
        return logp, torch.stack(self.kept, 1) if self.kept else torch.zeros(rows, 0, dtype=torch.int32)


class HFRollout:
    """Sampling with ``model.generate`` on an unwrapped copy of the policy.

    ``load_weights`` takes the trained weights one tensor at a time (``streams_weights``).

    With ``n > 1`` samples per prompt, each prompt is prefilled once and its KV cache
    repeated for its samples (``share_prompts``), instead of ``generate`` prefilling
    every copy: same outputs, 1/n of the prefill work.
    """

    streams_weights = True

    def __init__(
        self, model, tokenizer, max_prompt_tokens: int | None = None, share_prompts: bool = True,
        autocast_dtype: torch.dtype | None = None, return_logp: bool = False,
    ):
        self.model = model.eval()
        # Sampled tokens' log-probs under the generating weights (``Generation.rollout_logp``, recorded
        # by ``SampledLogprobs``): the behaviour policy of a batch trained after the weights moved on.
        self.return_logp = return_logp
        self.verify_sync = False  # rollout.verify_sync: keep sent_fingerprints for Worker.sync_check
        self.verify_stride = 1  # rollout.verify_sync_stride: fingerprint every Nth element
        self.weight_quant = "none"  # rollout.weight_quant: decoder linears fake-quantized as they arrive (rollout/quant.py)
        self.sent_fingerprints: dict[str, Fingerprint] | None = None
        self.autocast_dtype = autocast_dtype  # e.g. bfloat16 (trainer.precision=bf16): generate under autocast
        params = inspect.signature(type(model).forward).parameters
        self.share_prompts = share_prompts and "past_key_values" in params
        self._last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        eos = tokenizer.eos_token_id
        self.eos_ids = [eos] if isinstance(eos, int) else list(eos)
        gen_eos = getattr(model.generation_config, "eos_token_id", None)
        if gen_eos is not None:
            self.eos_ids = sorted(set(self.eos_ids) | set([gen_eos] if isinstance(gen_eos, int) else gen_eos))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

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
        most likely tokens (before top-p, as generate orders them).

        ``seeds`` (one per prompt): sample j of prompt i draws from its own stream seeded
        ``seeds[i] + j``; None: HF's sampler on torch's global RNG.
        """
        from transformers import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.max_prompt_tokens)
        dev = self.model.device
        # Pipelined runs want the sampled tokens' log-probs: a recorder sees each step's raw logits first.
        recorder = SampledLogprobs(temperature, top_p, top_k) if self.return_logp and temperature > 0 else None
        warpers = [TemperatureLogitsWarper(temperature)] if temperature not in (0, 1.0) else []
        warpers += [TopKLogitsWarper(top_k)] if top_k > 0 else []
        warpers += [TopPLogitsWarper(top_p)] if top_p < 1.0 else []
        if temperature == 0:
            kwargs = dict(do_sample=False)
        elif seeds is not None:  # greedy decoding of seeded Gumbel-perturbed, warped logits = sampling
            row_seeds = [int(s) + j for s in seeds for j in range(n)]
            processors = [*([recorder] if recorder else []), *warpers, SeededGumbelSampler(row_seeds, dev)]
            kwargs = dict(do_sample=False, logits_processor=LogitsProcessorList(processors))
        elif recorder is not None:  # HF's sampler after our recorder and the same warpers, in HF's order
            kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                          logits_processor=LogitsProcessorList([recorder, *warpers]))
        else:
            kwargs = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
        mask = prompt_mask.long()
        with torch.autocast(dev.type, dtype=self.autocast_dtype or torch.bfloat16, enabled=self.autocast_dtype is not None):
            if n > 1 and self.share_prompts and prompt_ids.shape[1] > 1:
                inputs = self._shared_prefill(prompt_ids, mask, n)
            else:  # n rows per prompt (as num_return_sequences=n would, which greedy search refuses)
                inputs = dict(input_ids=prompt_ids.repeat_interleave(n, 0).to(dev),
                              attention_mask=mask.repeat_interleave(n, 0).to(dev))
            out = self.model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                eos_token_id=self.eos_ids,
                pad_token_id=self.pad_id,
                use_cache=True,
                **kwargs,
            )
        response_ids = out[:, prompt_ids.shape[1] :].cpu()
        rollout_logp, kept = recorder.finish(out) if recorder is not None else (None, None)
        response_mask, truncated = response_mask_from_ids(response_ids, self.eos_ids)
        return grouped_generation(prompt_ids, prompt_mask, response_ids, response_mask, truncated, n, self.pad_id,
                                  rollout_logp, kept)

    def _shared_prefill(self, prompt_ids: torch.Tensor, mask: torch.Tensor, n: int) -> dict:
        """``generate`` inputs for n copies of each prompt, all but the last prompt token already cached.

        Positions follow ``generate``'s own rule (cumsum of the mask, 1 on padding), so the
        cache equals the one ``generate`` would have built for each copy.
        """
        from transformers import DynamicCache

        dev = self.model.device
        prompt_ids, mask = prompt_ids.to(dev), mask.to(dev)
        cache = DynamicCache(config=self.model.config)
        head = mask[:, :-1]
        positions = (head.cumsum(-1) - 1).masked_fill(head == 0, 1)
        self.model(input_ids=prompt_ids[:, :-1], attention_mask=head, position_ids=positions,
                   past_key_values=cache, use_cache=True, **self._last_logits_only)
        cache.batch_repeat_interleave(n)
        return dict(input_ids=prompt_ids.repeat_interleave(n, 0), attention_mask=mask.repeat_interleave(n, 0),
                    past_key_values=cache)

    def decode(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return decode_responses(self.tokenizer, response_ids, response_mask)

    @torch.no_grad()
    def load_weights(self, weights) -> None:
        """Copy trained weights (a dict, or (name, tensor) pairs drawn one at a time) into the rollout
        model in place (no reallocation)."""
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        tied = getattr(self.model.config, "tie_word_embeddings", False)  # the head is the embedding: sent once

        def as_engine(name, tensor):
            if tied and name == "lm_head.weight":
                return None
            t = tensor.to(params[name].dtype) if name in params else tensor
            return fake_quantize(t, self.weight_quant) if quantized(name) else t

        stream, sent = push_stream(named_tensors(weights), as_engine, self.verify_sync, self.verify_stride)
        for name, tensor in stream:
            target = params.get(name)
            if target is not None:  # a name the model lacks shows in the sync check (rollout.verify_sync)
                target.copy_(tensor)
        self.sent_fingerprints = sent

    def weight_fingerprints(self) -> dict[str, Fingerprint]:
        """Fingerprints of what the engine holds, by name: after a sync, equal to ``sent_fingerprints``."""
        return fingerprints([*self.model.named_parameters(), *self.model.named_buffers()], self.verify_stride)


def memory(facts: MemoryFacts) -> BackendMemory:
    """A full copy of the weights in each training worker's process."""
    worker = {"rollout engine (hf: full weights)": facts.params * facts.weight_bytes}
    if facts.checkpoint_bytes > 1.1 * facts.params * facts.weight_bytes:
        # loading a checkpoint at another dtype (bf16 from fp32): the rehearsal's hf workers kept the
        # file's pages mapped (1.84-1.94 GiB file-backed RSS; the vllm workers' training processes 0.23)
        worker["checkpoint file pages (converted at load)"] = facts.checkpoint_bytes
    return BackendMemory(worker=worker)


@register_backend("hf", summary="transformers generate with KV cache (CPU default)", memory=memory,
                  owns=("hf_dtype", "weight_quant"))  # the dials of a mismatch on purpose: this engine's weights
def build(ctx: RolloutContext) -> HFRollout:
    dtype = "float32" if ctx.device == "cpu" else ctx.model_dtype
    if ctx.settings.hf_dtype != "auto":  # rollout.hf_dtype: a mismatch with the trainer dialled on purpose
        dtype = ctx.settings.hf_dtype
    model = load_causal_lm(ctx.model_path, dtype, ctx.trust_remote_code)
    quantize_model(model, ctx.settings.weight_quant)  # rollout.weight_quant: the engine's starting weights too
    engine = HFRollout(
        model.to(ctx.device), ctx.tokenizer, ctx.max_prompt_tokens, ctx.share_prompts,
        autocast_dtype=torch.bfloat16 if ctx.autocast_bf16 else None,  # the trainer's bf16 compute
        return_logp=ctx.return_logp,  # behaviour log-probs of batches the trainer gets later
    )
    engine.weight_quant = ctx.settings.weight_quant
    return engine
