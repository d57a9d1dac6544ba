"""Every tiny tokenizer loads exactly as it was trained: spaced text round-trips through the tokenizer
the harness loads (harness.runtime.loading.load_tokenizer), with the ids the warm start was trained on.

transformers 5 loads a qwen2 model's tokenizer as Qwen2Tokenizer whatever tokenizer_config.json names,
and that class's pre-tokenizer drops the tiny tokenizer's spaces: "What is 3*4?" came back "Whatis3*4?"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.data.tasks import load_task, render_prompt
from harness.models import tiny_tokenizer, warm_start_turns
from harness.runtime.loading import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]

# Every buildable tiny model: each task the tiny warm start trains on, and the calculator environment's.
BUILDS = {
    "arith": [],
    "arith_calc+calculator": ["task=arith_calc", "env.name=calculator"],
    "reasoning": ["task=reasoning"],
    "gsm8k": ["task=gsm8k"],
    "math": ["task=math"],
}


def _texts(taught, limit: int = 300) -> list[str]:
    """Prompts and taught turns (spaces, newlines, punctuation), as the warm start tokenizes them."""
    out = []
    for ex, turns in taught[:limit]:
        out.append(render_prompt(ex.messages, None, False))
        out.extend(turns)
    return out


def _assert_round_trip(loaded, trained, texts: list[str]) -> None:
    for text in texts:
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        if trained is not None:
            assert ids == trained(text, add_special_tokens=False)["input_ids"], text
        assert loaded.decode(ids) == text


@pytest.mark.parametrize("build", list(BUILDS))
def test_every_tiny_build_loads_its_tokenizer_as_trained(build, compose_cfg, request, tmp_path):
    source = []
    if build in ("gsm8k", "math"):  # data that ships beside the checkout (skipped without it)
        source = [f"task.source={request.getfixturevalue('shared_data')}/{build}"]
    cfg = compose_cfg([*BUILDS[build], *source])
    task = load_task(cfg.task)
    taught = warm_start_turns(task, cfg.env if cfg.env.name else None, direct_frac=float(cfg.model.tiny.sft_direct_frac))
    trained = tiny_tokenizer(taught, cfg.model.tiny.vocab_size)
    trained.save_pretrained(tmp_path)  # as build_tiny saves it, beside a qwen2 config
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    loaded = load_tokenizer(str(tmp_path))
    texts = _texts(taught)
    if build != "arith":  # arith's texts have no spaces (and tokenize alike either way)
        assert any(" " in t for t in texts)
    _assert_round_trip(loaded, trained, texts)
    # An export (a policy or reward model saved by a run) re-saves the loaded tokenizer: it loads the same.
    loaded.save_pretrained(tmp_path / "export")
    (tmp_path / "export" / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    _assert_round_trip(load_tokenizer(str(tmp_path / "export")), trained, texts[:100])


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "harness" / "warmstart").iterdir() if p.is_dir()))
def test_every_shipped_warm_start_round_trips_its_task_text(name, compose_cfg):
    task = load_task(compose_cfg([f"task={name.removeprefix('tiny-').split('-')[0]}"]).task)  # tiny-<task>[-<role>]
    loaded = load_tokenizer(str(ROOT / "harness" / "warmstart" / name))
    texts = _texts([(ex, [ex.meta.get("solution", "")]) for ex in task.test[:200]])
    _assert_round_trip(loaded, None, [t for t in texts if t])
