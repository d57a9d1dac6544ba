"""Loading Hugging Face models and tokenizers (any hub id or local directory).

A path that cannot be loaded (missing, corrupt, not a model, a hub id while offline) raises
``ModelError`` with one line naming the path, instead of the library's traceback.
"""

from __future__ import annotations

import itertools
import json
import os

import torch

from harness.core.errors import ModelError


def _fail(what: str, path: str, exc: Exception) -> ModelError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return ModelError(f"model.path={path}: cannot load its {what} ({type(exc).__name__}: {first}); "
                      f"give a local Hugging Face model directory or a hub id (online, or already in the HF cache)")


# What a run loads from a hub repo: configs, safetensors weights, tokenizer files, remote code; not
# the duplicate .bin / .pth / gguf weights many repos also hold.
SNAPSHOT_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.py", "tokenizer*"]


def local_snapshot(hub_id: str) -> str:
    """``hub_id``'s files in the local Hugging Face cache, downloaded if they are not there yet.

    Called by the driver before any worker starts, and by a worker that does not find the driver's
    directory (another node): the cache's file locks make the workers of one node download once."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(hub_id, allow_patterns=SNAPSHOT_FILES)
    except Exception as exc:  # offline and not cached, unknown id, gated, no network
        raise _fail("files", hub_id, exc) from None


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _saved_as_generic(path: str) -> bool:
    """The tokenizer at ``path`` was saved from the generic fast class: its tokenizer.json is the whole
    tokenizer (a tiny build's, every export of one). ``tokenizer_as_saved`` in build_info.json: the
    marker of builds from before this rule."""
    import json
    from pathlib import Path

    try:
        config = Path(path) / "tokenizer_config.json"
        if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
            return (Path(path) / "tokenizer.json").is_file()
        info = Path(path) / "build_info.json"
        return bool(info.is_file() and json.loads(info.read_text()).get("tokenizer_as_saved"))
    except (OSError, ValueError):
        return False


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """The tokenizer at ``path``, exactly as it was saved.

    A tokenizer saved from the generic fast class (every tiny build and its exports) is loaded as
    that class: ``AutoTokenizer`` would pick the class of the model type instead (transformers 5
    does so for qwen2 configs whatever tokenizer_config.json names), and Qwen2Tokenizer replaces
    the saved pre-tokenizer with its own, under which a tiny tokenizer's spaces vanish. A hub model
    whose tokenizer_config.json names the generic class (Llama 3's PreTrainedTokenizerFast) is loaded
    the same way, from its tokenizer.json; any other (Qwen2Tokenizer, LlamaTokenizerFast, ...) goes
    through ``AutoTokenizer``."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        if _saved_as_generic(path):
            tok = PreTrainedTokenizerFast.from_pretrained(path)
        else:
            tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:  # OSError, ValueError, JSON errors of a corrupt file, ...
        raise _fail("tokenizer", path, exc) from exc
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, dtype: str, trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
    except Exception as exc:  # a missing or truncated weights file, a config of another architecture, ...
        raise _fail("model", path, exc) from exc


def is_sequence_classifier(path: str) -> bool:
    """A local directory holding an ``AutoModelForSequenceClassification`` export (a reward model)."""
    import json
    from pathlib import Path

    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return any(a.endswith("ForSequenceClassification") for a in architectures)


def load_sequence_classifier(path: str, dtype: str, trust_remote_code: bool = False):
    from transformers import AutoModelForSequenceClassification

    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise _fail("reward model", path, exc) from exc
    if model.config.num_labels != 1:
        raise ModelError(f"{path}: a reward model has one output (num_labels=1); this one has {model.config.num_labels}")
    return model


SHARD_BYTES = 2 * 2**30  # a Hugging Face directory's weights file size (transformers writes up to 5 GB)


def write_safetensors(tensors, out_dir: str, shard_bytes: int = SHARD_BYTES) -> None:
    """Write ``(name, tensor)`` pairs, drawn one at a time, as a Hugging Face directory's weights: one
    ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` files with ``model.safetensors.index.json``
    past ``shard_bytes``. At most one file's tensors are held at a time (a streamed export of a model
    no process holds whole)."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    written: list[str] = []  # temporary names, renamed once the number of files is known
    where: dict[str, int] = {}  # tensor name -> file number
    held: dict[str, torch.Tensor] = {}
    held_bytes = total_bytes = 0
    for name, tensor in itertools.chain(tensors, [(None, None)]):  # (None: the end: write what is held)
        nbytes = 0 if tensor is None else tensor.numel() * tensor.element_size()
        if held and (tensor is None or held_bytes + nbytes > shard_bytes):
            written.append(f"part-{len(written):05d}.safetensors")
            save_file({k: v.contiguous() for k, v in held.items()}, os.path.join(out_dir, written[-1]), metadata={"format": "pt"})
            held, held_bytes = {}, 0
        if tensor is not None:
            held[name], where[name] = tensor, len(written)
            held_bytes, total_bytes = held_bytes + nbytes, total_bytes + nbytes
    n = len(written)
    final = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for tmp, name in zip(written, final):
        os.replace(os.path.join(out_dir, tmp), os.path.join(out_dir, name))
    if n > 1:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total_bytes}, "weight_map": {k: final[i] for k, i in where.items()}}, f, indent=2)
