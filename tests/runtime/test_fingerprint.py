"""Per-tensor sync fingerprints (harness/runtime/rollout/fingerprint.py): values by hand, the engine's
fused and padded layouts undone, and the two planted faults (a lost tensor, two layers exchanged)
caught on the hf backend. tests/runtime/test_vllm.py plants the same faults on vLLM-CPU."""

from __future__ import annotations

import pytest
import torch

from harness.runtime.rollout import fingerprint as fp
from harness.runtime.rollout.fingerprint import (
    compare,
    engine_fingerprints,
    fingerprint,
    fingerprints,
    plant_fault,
)


def _weight(position: int) -> float:
    return (position * 1103515245 % 2**31) / 2**31 - 0.5


def test_the_three_numbers_by_hand():
    n, total, squares, projection = fingerprint(torch.tensor([[1.0, 2.0], [3.0, -4.0]]))
    assert (n, total, squares) == (4, 2.0, 30.0)
    want = 1.0 * _weight(0) + 2.0 * _weight(1) + 3.0 * _weight(2) - 4.0 * _weight(3)
    assert projection == pytest.approx(want, rel=1e-15)
    assert _weight(0) == -0.5 and -0.5 <= min(_weight(i) for i in range(1, 50)) < max(_weight(i) for i in range(50)) < 0.5


def test_chunks_give_the_same_numbers_as_one_pass(monkeypatch):
    t = torch.randn(1000, 37, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    whole = fingerprint(t)
    monkeypatch.setattr(fp, "CHUNK", 1000)  # 37 chunks, the last one short
    chunked = fingerprint(t)
    assert chunked[0] == whole[0] and chunked[1:] == pytest.approx(whole[1:], rel=1e-12)


def test_a_row_swap_keeps_sum_and_squares_but_moves_the_projection():
    t = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    swapped = t[[1, 0, 2, 3, 4, 5]]
    a, b = fingerprint(t), fingerprint(swapped)
    assert a[1] == pytest.approx(b[1], rel=1e-12) and a[2] == pytest.approx(b[2], rel=1e-12)
    report = compare({"w": a}, {"w": b})
    assert report.mismatched == ("w",) and report.max_rel_err > 1e-3


def test_a_stale_tensor_at_lr_1e_6_is_far_above_the_tolerance():
    """An AdamW step moves every element by ~lr: the engine still holding the old tensor must show."""
    old = 0.02 * torch.randn(256, 256, generator=torch.Generator().manual_seed(2))
    new = old - 1e-6 * torch.sign(torch.randn(256, 256, generator=torch.Generator().manual_seed(3)))
    report = compare({"w": fingerprint(new)}, {"w": fingerprint(old)})
    assert report.mismatched == ("w",) and report.max_rel_err > 1e-5  # ~0.3 x 1e-6 / 0.02
    same = compare({"w": fingerprint(new)}, {"w": fingerprint(new.clone())})
    assert same.mismatched == () and same.max_rel_err == 0.0
    absent = compare({"w": fingerprint(new), "b": fingerprint(old)}, {"w": fingerprint(new)})
    assert absent.mismatched == ("b",) and absent.metrics() == {"rollout/sync_checksum_rel_err": fp.ABSENT,
                                                                 "rollout/sync_mismatched_tensors": 1.0}  # fmt: skip


def test_a_strided_fingerprint_reads_every_nth_element_and_still_sees_stale_swapped_and_resized_tensors(monkeypatch):
    """rollout.verify_sync_stride: the sums over flat positions 0, N, 2N, ... only (by hand), and the faults a
    sampled check must still see: a stale tensor (every element moved), two rows exchanged (rows of 256 >= N),
    another size; a change to an unsampled element alone is what it gives up."""
    t = torch.arange(10.0).reshape(2, 5)
    n, total, squares, projection = fingerprint(t, stride=4)  # positions 0, 4, 8: values 0, 4, 8
    assert (n, total, squares) == (10, 12.0, 80.0)
    assert projection == pytest.approx(4.0 * _weight(4) + 8.0 * _weight(8), rel=1e-15)
    old = 0.02 * torch.randn(64, 256, generator=torch.Generator().manual_seed(2))
    new = old - 1e-6 * torch.sign(torch.randn(64, 256, generator=torch.Generator().manual_seed(3)))
    assert compare({"w": fingerprint(new, 64)}, {"w": fingerprint(old, 64)}).max_rel_err > 1e-5
    assert compare({"w": fingerprint(new, 64)}, {"w": fingerprint(new.clone(), 64)}).max_rel_err == 0.0
    swapped = new[[1, 0, *range(2, 64)]]
    assert compare({"w": fingerprint(new, 64)}, {"w": fingerprint(swapped, 64)}).mismatched == ("w",)
    assert compare({"w": fingerprint(new, 64)}, {"w": fingerprint(new[:63], 64)}).max_rel_err == fp.ABSENT
    unsampled = new.clone()
    unsampled.view(-1)[1] += 1.0  # position 1: not read at stride 64, read at stride 1
    assert compare({"w": fingerprint(new, 64)}, {"w": fingerprint(unsampled, 64)}).mismatched == ()
    assert compare({"w": fingerprint(new)}, {"w": fingerprint(unsampled)}).mismatched == ("w",)
    whole = fingerprint(new, 64)
    monkeypatch.setattr(fp, "CHUNK", 7)  # chunked over the sampled elements: the same numbers, positions kept
    assert fingerprint(new, 64)[1:] == pytest.approx(whole[1:], rel=1e-12)


class _Fused(torch.nn.Linear):
    def __init__(self, sizes: list[int]):
        super().__init__(4, sum(sizes))
        self.output_sizes = sizes


class _Padded(torch.nn.Embedding):
    def __init__(self, vocab: int, padded: int):
        super().__init__(padded, 4)
        self.org_vocab_size = vocab


def test_engine_names_split_fused_tensors_and_drop_vocabulary_padding():
    """vLLM's layout: q/k/v rows stacked in qkv_proj, gate/up in gate_up_proj, the vocabulary padded."""
    engine = torch.nn.Module()
    engine.embed = _Padded(10, 16)
    engine.layer = torch.nn.Module()
    engine.layer.qkv_proj = _Fused([8, 4, 4])
    hf = {"embed.weight": engine.embed.weight[:10],
          "layer.q_proj.weight": engine.layer.qkv_proj.weight[:8], "layer.k_proj.weight": engine.layer.qkv_proj.weight[8:12],
          "layer.v_proj.weight": engine.layer.qkv_proj.weight[12:], "layer.q_proj.bias": engine.layer.qkv_proj.bias[:8],
          "layer.k_proj.bias": engine.layer.qkv_proj.bias[8:12], "layer.v_proj.bias": engine.layer.qkv_proj.bias[12:]}  # fmt: skip
    held = engine_fingerprints(engine, {"qkv_proj": ["q_proj", "k_proj", "v_proj"]})
    assert held == fingerprints(hf.items())
    with torch.no_grad():
        engine.embed.weight[12] += 1.0  # a padding row: never sent, not compared
    assert compare(fingerprints(hf.items()), engine_fingerprints(engine, {"qkv_proj": ["q_proj", "k_proj", "v_proj"]})).mismatched == ()


def test_planted_faults_drop_or_swap_and_a_typo_is_refused():
    named = [("a", torch.zeros(2)), ("b", torch.ones(2)), ("c", torch.full((2,), 2.0))]
    assert [n for n, _ in plant_fault(named, "drop:b")] == ["a", "c"]
    swapped = dict(plant_fault(named, "swap:a,c"))
    assert swapped["a"].tolist() == [2.0, 2.0] and swapped["c"].tolist() == [0.0, 0.0]
    assert plant_fault(named, None) is named
    with pytest.raises(ValueError, match="drop:NAME or swap:A,B"):
        plant_fault(named, "drop:z")


@pytest.fixture(scope="module")
def hf_engine():
    from harness.models import new_qwen2, train_tokenizer
    from harness.runtime.rollout.hf import HFRollout

    torch.manual_seed(0)
    tok = train_tokenizer(["1 + 2 = 3", "4 + 5 = 9"], 60)
    model = new_qwen2(tok, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    trainer_state = {k: v.clone() + 0.01 for k, v in model.state_dict().items()}  # the trainer moved on
    engine = HFRollout(model, tok)
    engine.verify_sync = True
    return engine, trainer_state


@pytest.mark.parametrize("fault, lost", [
    (None, []),
    ("drop:model.layers.1.mlp.down_proj.weight", ["model.layers.1.mlp.down_proj.weight"]),
    ("swap:model.layers.0.self_attn.q_proj.weight,model.layers.1.self_attn.q_proj.weight",
     ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"]),
])  # fmt: skip
def test_the_hf_engine_catches_a_lost_or_misrouted_tensor(hf_engine, monkeypatch, fault, lost):
    engine, state = hf_engine
    engine.load_weights({k: v - 1.0 for k, v in state.items()})  # stale weights, before this sync
    if fault:
        monkeypatch.setenv(fp.FAULT_ENV, fault)
    engine.load_weights(state)
    report = compare(engine.sent_fingerprints, engine.weight_fingerprints())
    assert sorted(report.mismatched) == lost
    assert (report.max_rel_err > 1e-4) if lost else (report.max_rel_err == 0.0)
    assert report.tensors == len(state) - 1  # the tied head is the embedding: sent once


@pytest.mark.parametrize("fault, lost", [
    (None, []),
    ("swap:model.layers.0.self_attn.q_proj.weight,model.layers.1.self_attn.q_proj.weight",
     ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"]),
])  # fmt: skip
def test_the_hf_engine_sampling_every_16th_element_still_catches_a_misrouted_tensor(hf_engine, monkeypatch, fault, lost):
    """rollout.verify_sync_stride=16 on both sides (Worker sets verify_stride): an exact sync compares equal, a
    swap of two layers' tensors is named, and every element the stale engine held differs anyway."""
    engine, state = hf_engine
    monkeypatch.setattr(engine, "verify_stride", 16)
    engine.load_weights({k: v - 1.0 for k, v in state.items()})
    if fault:
        monkeypatch.setenv(fp.FAULT_ENV, fault)
    engine.load_weights(state)
    report = compare(engine.sent_fingerprints, engine.weight_fingerprints())
    assert sorted(report.mismatched) == lost and (report.max_rel_err > 1e-4 if lost else report.max_rel_err == 0.0)
    assert engine.sent_fingerprints["model.embed_tokens.weight"] == fingerprint(state["model.embed_tokens.weight"], 16)
