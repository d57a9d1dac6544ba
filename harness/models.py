"""Models: any HF id or local directory, or the offline ``tiny`` preset.

``tiny`` is built without any hub access: a BPE tokenizer trained with ``tokenizers``
on the task's text (digits always single tokens), a small Qwen2-architecture causal
LM, and a short SFT warm start on the task's train split, sized by a rule (``model.tiny.sft_steps=-1``:
at least ``sft_min_steps``, then until the held-out greedy accuracy reaches ``sft_accuracy_floor``; low, but
above zero, so RL has a signal to amplify) or a fixed ``sft_steps=N``.
The result is cached on disk, keyed by everything that shapes it, and reused.

The same seed and recipe give different weights on CPUs that round differently (AVX2 vs
AVX-512 kernels), so the default warm start (``model.path=tiny``, task ``arith`` at its
defaults) is not rebuilt but shipped in ``harness/warmstart/`` and verified by its
SHA-256 before use: every machine starts every run from the same bits. The hash of the
weights a run starts from goes into run.json (``model_info.weights_sha256``), and the
report never pools runs that started from different weights.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harness.config import Config, role_setting, teacher_model_config
from harness.core.errors import ModelError as ModelError  # re-exported: raised here
from harness.data.envs import EnvConfig
from harness.data.tasks import TaskConfig
from harness.runtime.loading import load_causal_lm as load_causal_lm  # re-exported for scripts and tests
from harness.runtime.loading import load_tokenizer as load_tokenizer
from harness.runtime.settings import LoraConfig, ModelConfig, TinyModelConfig
from harness.runtime.train import lora
from harness.scoring import ModelGenerator, accuracy_metrics, generate_and_score

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
TINY_BUILD_VERSION = 3  # bump when the build recipe changes: invalidates the cache (2: fixed SFT steps; 3: accuracy floor)
EOS = "<|endoftext|>"
SHIPPED_DIR = Path(__file__).resolve().parent / "warmstart"  # prebuilt warm starts, one folder each
# Task fields that shape the tiny model's data (tokenizer text, SFT pairs; arith's eval_prompts
# moves its train/test split, so it keys arith only); others (the checker) do not key the cache.
TASK_BUILD_KEYS = ("name", "source", "prompt_template", "use_chat_template", "max_prompt_tokens", "digits",
                   "operators", "terms", "train_size", "data_seed", "eval_prompts")


def weights_sha256(path: str | Path) -> str | None:
    """SHA-256 over the bytes of a model directory's ``*.safetensors`` files (sorted by name);
    None when the directory has none (a hub id, or .bin weights)."""
    files = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _plain(cfg: object) -> dict:  # a group's dataclass, or its DictConfig node
    if is_dataclass(cfg):
        return asdict(cfg)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def sft_target(task_name: str, ground_truth: str) -> str:
    """The response the warm start teaches: the answer in the form the checker expects
    (the task's registered ``answer_format``)."""
    from harness.data.tasks import get_task

    return get_task(task_name).answer_format(ground_truth)


def train_tokenizer(texts: list[str], vocab_size: int):
    """A BPE tokenizer trained on ``texts``: single-digit tokens, spaces kept via Metaspace."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(behavior="isolated"),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, "<unk>"], show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=EOS, unk_token="<unk>", padding_side="left"
    )


def tiny_tokenizer(taught: list[tuple[Any, list[str]]], vocab_size: int):
    """A tiny build's tokenizer: trained on its warm start's texts (each prompt with its taught turns)."""
    from harness.data.tasks import render_prompt

    texts = [render_prompt(ex.messages, None, False) + "".join(turns) for ex, turns in taught]
    return train_tokenizer(texts[:50000], vocab_size)


def _holdout_accuracy(model, tokenizer, examples, checker, task_name, max_new_tokens) -> float:
    """Accuracy of the model's temperature-0 responses, through the shared generate-and-score path."""
    scored = generate_and_score(ModelGenerator(model, tokenizer), examples, checker,
                                chunk_prompts=max(len(examples), 1), max_tokens=max_new_tokens)  # fmt: skip
    model.train()
    return accuracy_metrics(scored, task_name)[f"eval/{task_name}/accuracy"]


def new_qwen2(tokenizer, hidden_size: int, intermediate_size: int, num_layers: int, num_heads: int,
              num_kv_heads: int, max_positions: int = 2048, vocab_size: int | None = None,
              tie_embeddings: bool = True, **config: Any):
    """A randomly initialised Qwen2-architecture causal LM for ``tokenizer`` (vocabulary ``len(tokenizer)``
    unless given, tied embeddings unless told, no BOS, the tokenizer's EOS/pad also in the generation config).
    The one place the project builds a Qwen2 from scratch; ``config``: more Qwen2Config fields."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab_size or len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=tie_embeddings, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None, **config,
    ))  # fmt: skip
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def warm_start_turns(task, env: EnvConfig | None = None, direct_frac: float = 0.0) -> list[tuple[Any, list[str]]]:
    """Per training example: (the example as the model is prompted, the turns it is taught).

    Single-turn: [the answer in the task's format]. With an environment (``env.name``), prompts
    are the environment's first messages, and a fixed ``env.demo_frac`` of the examples (chosen
    with a fixed seed) are taught the environment's worked episode (``Environment.demo``: model
    turn, observation, ..., answer); the rest answer directly, so the start has seen tool use
    without relying on it.

    ``direct_frac`` (``model.tiny.sft_direct_frac``), tasks with worked solutions: that fraction of the
    problems of 3+ steps (fixed seed) is taught the bare answer instead; 2-step problems stay worked."""
    from harness.data.envs import make_env
    from harness.data.tasks import Example

    if direct_frac > 0 and not any(ex.meta.get("solution") for ex in task.train[:100]):
        raise ModelError(f"model.tiny.sft_direct_frac={direct_frac}: task {task.name} has no worked solutions "
                         f"to replace by the bare answer; leave it at 0")
    out, pick, bare = [], random.Random(0), random.Random(1)
    for ex in task.train:
        # a worked solution where the task has one (reasoning), else the answer in the checker's format
        answer = sft_target(task.name, ex.ground_truth)
        worked = ex.meta.get("solution")
        if worked and direct_frac > 0 and ex.meta.get("steps", 0) > 2 and bare.random() < direct_frac:
            worked = answer
        direct = [worked or answer]
        if env is None or not env.name:
            out.append((ex, direct))
            continue
        instance = make_env(env.name, max_turns=env.max_turns)
        prompted = Example(instance.reset(ex), ex.ground_truth)
        demo = instance.demo(ex) if pick.random() < env.demo_frac else None
        out.append((prompted, demo or direct))
    return out


def build_tiny(tiny: TinyModelConfig, task, checker, out_dir: Path, max_new_tokens: int, env: EnvConfig | None = None) -> dict:
    """Build tokenizer + model + SFT warm start into ``out_dir``; returns build info.

    ``env`` (the ``env.*`` config): prompts and worked episodes of that environment
    (``warm_start_turns``); the loss covers the model's turns (each ending in EOS), not the
    environment's observations."""
    from harness.data.tasks import render_prompt

    t0 = time.perf_counter()
    seed = 0  # the tiny model is a fixed "base model": run seeds vary RL, not the base
    random.seed(seed)
    torch.manual_seed(seed)
    taught = warm_start_turns(task, env, direct_frac=float(tiny.sft_direct_frac))
    tokenizer = tiny_tokenizer(taught, tiny.vocab_size)
    model = new_qwen2(tokenizer, tiny.hidden_size, tiny.intermediate_size, tiny.num_layers, tiny.num_heads,
                      tiny.num_kv_heads, tie_embeddings=tiny.tie_embeddings)  # fmt: skip
    params = sum(p.numel() for p in model.parameters())

    # Held-out train prompts: logged, and the sizing rule's stop test; the test split stays unseen.
    holdout, sft_pool = [ex for ex, _ in taught[-128:]], taught[:-128] or taught
    eos_id = tokenizer.eos_token_id
    encoded = []
    for ex, turns in sft_pool:
        p = tokenizer(render_prompt(ex.messages, None, False), add_special_tokens=False)["input_ids"]
        r, trained = [], []
        for k, text in enumerate(turns):  # model turns (even k) end in EOS and are learned; observations are read
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos_id] if k % 2 == 0 else [])
            r += ids
            trained += [k % 2 == 0] * len(ids)
        encoded.append((p[-256:], r[:256], trained[:256]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=tiny.sft_lr, weight_decay=0.0)
    rng = random.Random(seed)
    model.train()
    accuracy = _holdout_accuracy(model, tokenizer, holdout, checker, task.name, max_new_tokens)
    history = [(0, accuracy)]
    # sft_steps=-1: the sizing rule (at least sft_min_steps, then until the accuracy floor); N: exactly N
    ruled = int(tiny.sft_steps) < 0
    min_steps = int(tiny.sft_min_steps) if ruled else int(tiny.sft_steps)
    floor = float(tiny.sft_accuracy_floor) if ruled else 0.0
    max_steps = int(tiny.sft_max_steps) if ruled else min_steps  # validate: sft_max_steps >= the least steps
    every_past_min = int(tiny.sft_eval_every) or 50
    steps = 0
    while steps < max_steps:
        steps += 1
        rows = [encoded[rng.randrange(len(encoded))] for _ in range(tiny.sft_sequences_per_step)]
        width = max(len(p) + len(r) for p, r, _ in rows)
        ids = torch.full((len(rows), width), eos_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (p, r, trained) in enumerate(rows):  # right-padded; loss on the model's tokens only
            seq = p + r
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, len(p) : len(seq)] = torch.tensor(r).masked_fill(~torch.tensor(trained, dtype=torch.bool), -100)
            mask[i, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        past_min = steps - min_steps  # checks: every sft_eval_every steps up to min_steps, then from it
        due = (past_min < 0 and tiny.sft_eval_every and steps % tiny.sft_eval_every == 0) or \
            (past_min >= 0 and (past_min % every_past_min == 0 or steps == max_steps))
        if due:
            accuracy = _holdout_accuracy(model, tokenizer, holdout, checker, task.name, max_new_tokens)
            history.append((steps, accuracy))
            log.info("tiny warm start: SFT step %d, loss %.3f, held-out accuracy %.3f", steps, loss.item(), accuracy)
        if due and past_min >= 0 and accuracy >= floor:
            break
    if ruled and accuracy < floor:
        log.warning("tiny warm start: held-out accuracy %.3f after %d SFT steps is below model.tiny.sft_accuracy_floor="
                    "%.2f: RL may find few correct samples (raise model.tiny.sft_max_steps or the model size)",
                    accuracy, steps, floor)  # fmt: skip
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    info = {
        "params": params,
        "vocab_size": len(tokenizer),
        "sft_steps": steps,
        "sft_rule": (f"at least {min_steps} steps, then until held-out accuracy >= {floor} (at most {max_steps})"
                     if ruled else f"exactly {min_steps} steps"),
        "sft_seconds": round(time.perf_counter() - t0, 2),
        "sft_holdout_accuracy": accuracy,
        "sft_history": history,
        "build_version": TINY_BUILD_VERSION,
        "weights_sha256": weights_sha256(out_dir),
        "cpu_flags": cpu_flags(),
    }
    (out_dir / "build_info.json").write_text(json.dumps(info, indent=2))
    return info


def cpu_flags() -> str:
    """The SIMD flags that decide which float kernels run (avx2, avx512*, amx*), for provenance."""
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")).split()
    except (OSError, StopIteration):
        return platform.machine()
    keep = sorted({f for f in flags if f.startswith(("avx", "amx", "fma", "sse4"))})
    return " ".join(keep)


def bf16_is_emulated() -> bool:
    """True on an x86 CPU without bf16 instructions (avx512_bf16, amx_bf16): there torch emulates
    bf16 matmuls, and a bf16 step measured 12x slower than fp32 on an AVX2-only machine."""
    flags = cpu_flags().split()
    return platform.machine() in ("x86_64", "AMD64") and not {"avx512_bf16", "amx_bf16"} & set(flags)


def tiny_cache_key(cfg: ModelConfig, task_cfg: TaskConfig, max_new_tokens: int, env: EnvConfig | None = None) -> str:
    tiny = {k: v for k, v in _plain(cfg.tiny).items() if k not in ("cache_dir", "sft_max_new_tokens")}
    for key, default in (("tie_embeddings", True), ("sft_direct_frac", 0.0)):  # added later: defaults keep old keys
        if tiny.get(key, default) == default:
            tiny.pop(key, None)
    if tiny.get("sft_steps", -1) >= 0:  # a fixed count: the rule's floor and cap play no part
        for key in ("sft_min_steps", "sft_accuracy_floor", "sft_max_steps"):
            tiny.pop(key, None)
    task = {k: v for k, v in _plain(task_cfg).items() if k in TASK_BUILD_KEYS}
    if task.get("name") not in ("arith", "arith_calc", "reasoning"):
        task.pop("eval_prompts", None)  # only the generated tasks split one pool by it
    built = {"tiny": tiny, "task": task, "max_new_tokens": max_new_tokens, "v": TINY_BUILD_VERSION}
    if env is not None and env.name:  # only then: single-turn keys (and the shipped warm start) stay as they were
        built["env"] = {"name": env.name, "max_turns": env.max_turns, "demo_frac": env.demo_frac}
    blob = json.dumps(built, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def shipped_warm_start(key: str) -> Path | None:
    """The shipped warm start built with cache key ``key``, verified; None if none ships for it."""
    for d in sorted(SHIPPED_DIR.glob("tiny-*")) if SHIPPED_DIR.is_dir() else []:
        info = json.loads((d / "build_info.json").read_text())
        if info.get("cache_key") != key:
            continue
        actual = weights_sha256(d)
        if actual != info["weights_sha256"]:
            raise ModelError(
                f"shipped warm start {d} is corrupt: weights SHA-256 {actual} != {info['weights_sha256']} recorded "
                f"at build time; restore it with `git checkout -- {d.relative_to(SHIPPED_DIR.parents[1])}`"
            )
        return d
    return None


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id (``org/name``: one slash, no dots or tilde in front)."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or "\\" in path


def cached_build(cache: Path, name: str, lock_name: str, build: Callable[[Path], None],
                 ready: Callable[[Path], bool]) -> Path:  # fmt: skip
    """``cache/name``, built once by ``build(tmp_dir)`` unless ``ready`` already: under a file lock
    (parallel sweep runs build it once), into a temporary directory renamed when complete, so a
    crash never leaves a half-built directory that looks finished."""
    target = cache / name
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{lock_name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready(target):
            tmp = cache / f".tmp-{lock_name}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
    return target


def resolve_model(cfg: ModelConfig, task, checker, max_new_tokens: int, console=None, env: EnvConfig | None = None) -> tuple[str, dict]:
    """Directory (or hub id) of the model to train, building the tiny preset if needed
    (``env``: the ``env.*`` config, whose prompts and worked episodes the tiny warm start learns).

    Returns (path, info); info holds ``weights_sha256`` of the starting weights when they
    are local safetensors (None for a hub id), and the build record for ``tiny``.
    """
    if cfg.path != "tiny":
        path = Path(cfg.path).expanduser()
        if path.exists():
            if not (path / "config.json").is_file():
                raise ModelError(f"model.path={cfg.path} is not a Hugging Face model directory (no config.json)")
            return str(path), {"weights_sha256": weights_sha256(path)}
        if _looks_local(cfg.path):
            raise ModelError(f"model.path={cfg.path}: no such directory (a hub id looks like org/name; "
                             f"model.path=tiny builds the offline tiny model)")  # fmt: skip
        from harness.runtime.loading import local_snapshot

        local = local_snapshot(cfg.path)  # once, here: the workers get this directory, not the hub id
        return local, {"weights_sha256": weights_sha256(Path(local)), "hub_id": cfg.path}
    max_new_tokens = int(cfg.tiny.sft_max_new_tokens or max_new_tokens)  # the build's, not the run's
    key = tiny_cache_key(cfg, task.config, max_new_tokens, env)
    shipped = shipped_warm_start(key)
    if shipped is not None:  # bit-identical on every machine
        info = json.loads((shipped / "build_info.json").read_text())
        return str(shipped), {**info, "source": "shipped"}
    cache = Path(os.path.expanduser(cfg.tiny.cache_dir))

    def build(tmp: Path) -> None:
        if console:
            console.print(f"[bold]Building the tiny model[/] (cached in {cache}) ...")
        tmp.mkdir(parents=True)
        build_tiny(cfg.tiny, task, checker, tmp, max_new_tokens, env)

    target = cached_build(cache, f"tiny-{task.name}-{key}", f"tiny-{key}", build,
                          ready=lambda d: (d / "build_info.json").exists())  # fmt: skip
    info = json.loads((target / "build_info.json").read_text())
    return str(target), {**info, "source": "built here", "cache_key": key}


def local_model_dir(path: str, field: str) -> str:
    """A model given by a setting (``field``, named in errors): a local directory (``~`` expanded), or a
    hub id fetched once into the local cache."""
    local = Path(path).expanduser()
    if local.exists() or _looks_local(path):
        if not (local / "config.json").is_file():
            raise ModelError(f"{field}={path}: not a model directory (no config.json); give a Hugging Face model "
                             f"directory (a run's checkpoints/step_N/policy), a hub id, or 'tiny'")  # fmt: skip
        return str(local)
    from harness.runtime.loading import local_snapshot

    return local_snapshot(path)


def check_same_vocab(path: str, policy_tokenizer: PreTrainedTokenizerBase, setting: str, why: str, trust_remote_code: bool = False) -> None:
    """A model that scores the policy's token ids (``setting``, named in the error) must read them with the
    policy's vocabulary; ``why`` ends the error (what to give instead)."""
    if load_tokenizer(path, trust_remote_code).get_vocab() != policy_tokenizer.get_vocab():
        raise ModelError(f"{setting}: its tokenizer differs from the policy's (model.path); {why}")


def save_policy_dir(state_dict: dict[str, torch.Tensor], base_path: str, tokenizer, out_dir: str | Path,
                    trust_remote_code: bool = False, lora_cfg: LoraConfig | None = None, dtype: str | None = None) -> str | None:
    """Write trained weights as a Hugging Face model directory (config, safetensors, tokenizer)
    that ``harness eval model.path=<out_dir>`` (or any HF tool) loads; returns its weights hash.

    With ``lora_cfg`` (LoRA on), ``state_dict`` holds the adapters only: they are merged into the
    base model's weights, and also written in peft's format to ``<out_dir>_adapter``. ``dtype``
    (e.g. "bfloat16"): the export's; default the state's (LoRA adapters are float32 whatever the
    model's dtype, so pass it with ``lora_cfg``)."""
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype) if dtype else next(iter(state_dict.values())).dtype
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype, trust_remote_code=trust_remote_code)
    if lora_cfg is not None:
        lora.save_adapter(state_dict, lora_cfg, base_path, f"{out_dir}_adapter")
        state_dict = lora.merge_adapters(model.state_dict(), state_dict, lora.scaling(lora_cfg))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    tied = {k for k, _ in model.named_parameters(remove_duplicate=False)} - {k for k, _ in model.named_parameters()}
    if unexpected or set(missing) - tied:
        raise ModelError(f"policy weights do not fit {base_path}: missing {sorted(set(missing) - tied)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return weights_sha256(out_dir)


def save_policy_files(base_path: str, tokenizer, out_dir: str | Path, trust_remote_code: bool = False,
                      dtype: str | None = None) -> None:
    """What a Hugging Face model directory holds beside its weights (written by ``HybridEngine.export_policy``):
    the config (stating the export's ``dtype``), the generation config, the tokenizer, and for a model with
    remote code its .py files."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(base_path, trust_remote_code=trust_remote_code)
    if dtype:
        config.dtype = dtype
    config.save_pretrained(out_dir)
    with contextlib.suppress(OSError):  # a base without generation_config.json
        GenerationConfig.from_pretrained(base_path).save_pretrained(out_dir)
    if trust_remote_code:
        for code in Path(base_path).glob("*.py"):
            shutil.copy2(code, Path(out_dir) / code.name)
    tokenizer.save_pretrained(out_dir)


# ---------------------------------------------------------------------------- shapes (harness plan, the preflight)


@dataclass
class ModelShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def parameters(self) -> int:
        head_dim = self.hidden // self.heads
        attn = self.hidden * head_dim * (self.heads * 2 + self.kv_heads * 2) + head_dim * (self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + 2 * self.hidden
        embed = self.vocab * self.hidden
        return embed * (1 if self.tied else 2) + self.layers * per_layer + self.hidden


def model_shape(cfg: Config, model_path: str | None = None) -> ModelShape:
    """The shape of ``model.path`` (or of a role's ``model_path``): its config.json, or the tiny model's
    settings ('tiny'; a role's 'tiny' is the tiny teacher, model.tiny with teacher.*)."""
    path_setting = cfg.model.path if model_path is None else model_path
    if path_setting == "tiny":
        if model_path is None:
            t = cfg.model.tiny
        else:
            t = teacher_model_config(cfg.model, cfg.teacher).tiny
        return ModelShape(t.hidden_size, t.intermediate_size, t.num_layers, t.num_heads, t.num_kv_heads,
                          t.vocab_size, True)  # fmt: skip
    path = Path(path_setting).expanduser() / "config.json"
    if not path.is_file():
        what = "model.path" if model_path is None else role_setting(cfg.algo, model_path, "a model role's init")
        raise FileNotFoundError(f"{what}={path_setting}: harness plan reads a local config.json (no hub access)")
    c = json.loads(path.read_text())
    return ModelShape(c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"],
                      c.get("num_key_value_heads", c["num_attention_heads"]), c["vocab_size"],
                      bool(c.get("tie_word_embeddings", False)))  # fmt: skip


def known_parameters(cfg: Config) -> int | None:
    """The parameter count of model.path (the GPU preflight's /dev/shm check): its local config.json, or the hub
    cache's; None without either."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return model_shape(cfg).parameters
    except FileNotFoundError:
        pass
    try:
        cached = try_to_load_from_cache(str(cfg.model.path), "config.json")
    except ValueError:  # not a hub id either
        return None
    return model_shape(cfg, str(Path(cached).parent)).parameters if isinstance(cached, str) else None
