"""Rollout backend ``hf``: transformers ``generate`` with KV cache (the CPU default).

The backend owns its own copy of the model; ``load_weights`` receives the trained
weights after every update (the same hand-over a vLLM engine gets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Generation:
    """Token-level output of one generate call (n samples per prompt, grouped)."""

    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P] bool
    response_ids: torch.Tensor  # [B, T] right-padded with pad_id
    response_mask: torch.Tensor  # [B, T] bool, True up to and including the first EOS
    truncated: torch.Tensor  # [B] bool, no EOS within the token budget
    group_ids: torch.Tensor  # [B] index of the source prompt
    rollout_logp: torch.Tensor | None = None  # [B, T] the rollout engine's log-prob of each token (0 on padding); None if not reported


def encode_prompts(tokenizer, prompts: list[str], max_prompt_tokens: int | None = None):
    """Left-padded prompt ids and mask."""
    enc = tokenizer(
        prompts,
        return_tensors="pt",
        padding=True,
        padding_side="left",
        add_special_tokens=False,
        truncation=max_prompt_tokens is not None,
        max_length=max_prompt_tokens,
    )
    return enc["input_ids"], enc["attention_mask"].bool()


def response_mask_from_ids(response_ids: torch.Tensor, eos_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of tokens up to and including the first EOS, and whether no EOS appeared."""
    is_eos = torch.isin(response_ids, torch.tensor(eos_ids, dtype=response_ids.dtype))
    eos_before = is_eos.long().cumsum(-1) - is_eos.long()  # EOS tokens strictly before t
    mask = eos_before == 0
    truncated = ~is_eos.any(-1)
    return mask, truncated


def grouped_generation(
    prompt_ids, prompt_mask, response_ids, response_mask, truncated, n: int, pad_id: int, rollout_logp=None
) -> Generation:
    """The backend-independent output: prompts repeated n times, padding set to pad_id (logp 0)."""
    return Generation(
        prompt_ids=prompt_ids.repeat_interleave(n, 0),
        prompt_mask=prompt_mask.repeat_interleave(n, 0),
        response_ids=response_ids.masked_fill(~response_mask, pad_id),
        response_mask=response_mask,
        truncated=truncated,
        group_ids=torch.arange(prompt_ids.shape[0]).repeat_interleave(n),
        rollout_logp=None if rollout_logp is None else rollout_logp.masked_fill(~response_mask, 0.0),
    )


def decode_responses(tokenizer, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    rows = [ids[m].tolist() for ids, m in zip(response_ids, response_mask)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


class HFRollout:
    """Sampling with ``model.generate`` on an unwrapped copy of the policy."""

    def __init__(self, model, tokenizer, max_prompt_tokens: int | None = None):
        self.model = model.eval()
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
    ) -> Generation:
        """``n`` samples per prompt (greedy when temperature == 0), grouped by prompt."""
        prompt_ids, prompt_mask = encode_prompts(self.tokenizer, prompts, self.max_prompt_tokens)
        greedy = temperature == 0
        kwargs = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        out = self.model.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask.long(),
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
            **kwargs,
        )
        response_ids = out[:, prompt_ids.shape[1] :]
        response_mask, truncated = response_mask_from_ids(response_ids, self.eos_ids)
        return grouped_generation(prompt_ids, prompt_mask, response_ids, response_mask, truncated, n, self.pad_id)

    def decode(self, response_ids: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        return decode_responses(self.tokenizer, response_ids, response_mask)

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy trained weights into the rollout model in place (no reallocation)."""
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        for name, tensor in state_dict.items():
            target = params.get(name)
            if target is None:
                continue  # e.g. a tied lm_head already covered by the embedding
            target.copy_(tensor.to(target.dtype))
