"""Per-rank memory that falls with the world size (issue #48; docs/scale.md, per-rank memory).

- meta_init: a policy built on the meta device and filled shard by shard holds exactly the
  checkpoint's weights (and rotary buffers), draws no random numbers, and falls back to a full load
  for a checkpoint that is not safetensors;
- TrainEngine.full_tensors: the weight sync's tensors, one at a time, equal to the whole state;
- bench/bench_rank_memory.py on a 27M model at 1, 2 and 4 gloo ranks: the persistent part falls as
  1/N (plus a per-rank constant), and the sync's transient is a few copies of one tensor, not the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.runtime.train.fsdp import TrainEngine, init_distributed
from harness.runtime.train.meta_init import empty_causal_lm, is_empty

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024**2
PER_RANK_CONSTANT_MIB = 64  # measured 25-40 (below); a rank holding the whole model would be ~270 over


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    model = Qwen2ForCausalLM(config)
    path = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(path)
    bin_path = tmp_path_factory.mktemp("ckpt_bin")  # an older export: pytorch_model.bin, no safetensors
    model.config.save_pretrained(bin_path)
    torch.save(model.state_dict(), bin_path / "pytorch_model.bin")
    return path, bin_path, {k: v.clone() for k, v in model.state_dict().items()}, dict(model.named_buffers())


def test_an_empty_model_filled_by_shards_holds_the_checkpoint(checkpoint):
    path, _, want, buffers = checkpoint
    init_distributed("cpu")
    model = empty_causal_lm(str(path), "float32")
    assert is_empty(model) and all(p.device.type == "meta" for p in model.parameters())
    assert all(b.device.type == "cpu" for b in model.buffers())  # rotary tables built, not loaded
    engine = TrainEngine(model, "cpu", "fp32", SimpleNamespace(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0,
                                                              warmup_steps=0, grad_clip=1.0))  # fmt: skip
    got = dict(engine.full_tensors())
    assert set(got) == set(want) - {"lm_head.weight"}  # the tied head comes once, as the embedding
    assert all(torch.equal(got[k], want[k]) for k in got)
    held = dict(engine.model.named_buffers())
    assert all(torch.equal(held[k], b) for k, b in buffers.items())
    whole = engine.full_state_dict(all_ranks=True)
    assert all(torch.equal(whole[k], v) for k, v in got.items())
    bf16 = dict(engine.full_tensors(torch.bfloat16))
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, want[k].to(torch.bfloat16)) for k, v in bf16.items())


def test_building_empty_draws_no_random_numbers(checkpoint):
    path = str(checkpoint[0])
    torch.manual_seed(7)
    empty_causal_lm(path, "float32")
    after = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(after, torch.rand(3))  # a role built next (a LoRA adapter, a value head) is unchanged


def test_a_checkpoint_without_safetensors_is_loaded_whole(checkpoint):
    _, bin_path, want, _ = checkpoint
    model = empty_causal_lm(str(bin_path), "float32")
    assert not is_empty(model) and torch.equal(model.state_dict()["model.norm.weight"], want["model.norm.weight"])


def test_the_roles_are_built_empty_and_hold_the_checkpoint(checkpoint):
    """Roles load as the policy does, no rank holding the whole model: a frozen reference at its dtype, and a
    critic's body, its zero-initialised scalar head kept (it is not in the checkpoint)."""
    from algorithms.base import Role
    from harness.runtime.workers.worker import build_role_model

    path, _, want, _ = checkpoint
    init_distributed("cpu")
    reference = build_role_model(Role("reference"), str(path), "bfloat16", False)
    assert is_empty(reference) and all(p.device.type == "meta" for p in reference.parameters())
    got = dict(TrainEngine(reference, "cpu", "fp32", None).full_tensors())
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, want[k].to(torch.bfloat16)) for k, v in got.items())
    torch.manual_seed(3)
    critic = build_role_model(Role("critic", head="scalar"), str(path), "float32", False)
    after_critic = torch.rand(3)
    assert is_empty(critic) and critic.value_head.weight.device.type == "cpu"
    got = dict(TrainEngine(critic, "cpu", "fp32", None).full_tensors())
    assert set(got) == {k for k in want if k.startswith("model.")} | {"value_head.weight", "value_head.bias"}
    assert all(torch.equal(got[k], want[k]) for k in got if k.startswith("model."))
    assert not got["value_head.weight"].any() and not got["value_head.bias"].any()
    torch.manual_seed(3)
    build_role_model(Role("critic", head="scalar"), str(path), "float32", False, empty=False)
    assert torch.equal(torch.rand(3), after_critic)  # the same draws as the whole load: later roles unchanged
    whole = build_role_model(Role("reference"), str(path), "float32", False, empty=False)  # an adapted role
    assert not is_empty(whole) and torch.equal(whole.state_dict()["model.norm.weight"], want["model.norm.weight"])


@pytest.mark.integration
def test_per_rank_memory_falls_with_the_world_size(tmp_path):
    """The bench at a smaller size (27M parameters: 12 B each = 310 MiB of weights and moments at 1 rank)."""
    out = tmp_path / "memory.json"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_rank_memory.py"), "--code", "after", "--ranks", "1,2,4",
           "--layers", "6", "--hidden", "512", "--intermediate", "2048", "--vocab", "8000", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    worlds, params = result["worlds"], result["params"]
    persistent = {w: max(r["train"]["after_mib"] for r in worlds[f"after/{w}"]) for w in (1, 2, 4)}
    # 1/N of the 1-rank figure plus a per-rank constant (gloo's buffers, the allocator): measured 342, 186
    # and 108 MiB at 1, 2 and 4 ranks (0.32x at 4) on a 2-core Xeon, 2026-12-05, and on another 2-core Xeon
    # the same day, at the same commit, 358, 204 and 129 (0.36x; the constant 25 at 2 ranks, 40 at 4)
    for w in (2, 4):
        assert persistent[w] <= persistent[1] / w + PER_RANK_CONSTANT_MIB, persistent
    # the sync gathers one tensor at a time: its transient is a few copies of the largest (the embedding,
    # 8 MiB at bf16), never the model (52 MiB at bf16; the whole-state gather it replaced held 4 B x params)
    largest_bf16 = 2 * 8000 * 512 / MIB
    for w in (1, 2, 4):
        sync = max(r["sync"]["transient_mib"] for r in worlds[f"after/{w}"])
        assert sync <= 4 * largest_bf16 + 16 < 2 * params / MIB, (w, sync)
    # the checkpoint gathers nothing for the resumable state (each rank writes its shards) and streams the
    # policy's export: rank 0 holds one weights file (here the whole fp32 policy, under the 2 GiB file size)
    # beside one gathered tensor, the others one gathered tensor; the gather it replaced held 12 B x params
    gathered = 4 * (4 * 8000 * 512 / MIB) + 16
    for w in (2, 4):
        ranks = worlds[f"after/{w}"]
        assert ranks[0]["checkpoint"]["transient_mib"] <= 4 * params / MIB + gathered < 12 * params / MIB, (w, ranks[0])
        assert all(r["checkpoint"]["transient_mib"] <= gathered for r in ranks[1:]), (w, ranks)


@pytest.mark.integration
def test_one_fake_rank_of_four_holds_its_shards_and_the_gathered_root(tmp_path):
    """bench/bench_fake_ranks.py at its tiny shape (hidden 256, vocab 32000, tied: an 8.2M-parameter root of
    8.7M): rank 0 of 4 in one process through torch's fake process group. What it keeps is its quarter of the
    weights and AdamW's moments; its update holds the gathered root (31 MiB at fp32) and the root's full fp32
    gradient, which only the gathers of a real (or fake) group put there: a rank that held shards alone would
    stay near its 25 MiB. The plan names the same terms (harness/plan.py)."""
    out = tmp_path / "fake.json"
    cmd = [sys.executable, str(ROOT / "bench" / "bench_fake_ranks.py"), "--shape", "tiny", "--world", "4",
           "--dir", str(tmp_path / "model"), "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    measured, plan_gib, params = result["measured"], result["plan_gib"], result["params"]
    root_mib = 4 * (32000 * 256 + 256) / MIB
    assert measured["train"]["after_mib"] <= 12 * params / 4 / MIB + PER_RANK_CONSTANT_MIB
    assert measured["train"]["transient_mib"] >= 2 * root_mib, measured["train"]
    assert plan_gib["FSDP gathered root (embeddings, LM head, norm)"] * 1024 == pytest.approx(root_mib)
    assert plan_gib["FSDP reduce-scatter input (the root's full fp32 gradient)"] * 1024 == pytest.approx(root_mib)
    assert not (tmp_path / "model" / "checkpoint-4").exists()  # its shards and export are removed after
