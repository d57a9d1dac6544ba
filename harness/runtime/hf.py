"""Loading Hugging Face models and tokenizers (any hub id or local directory)."""

from __future__ import annotations

import torch


def load_tokenizer(path: str, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, dtype: str, trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
    )
