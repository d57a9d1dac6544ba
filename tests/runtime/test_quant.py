"""Simulated low-precision rollout weights (rollout.weight_quant; harness/runtime/rollout/quant.py): the
per-channel fake quantization by hand, the hf engine holding exactly the quantized matrices (and the exact
rest) after a sync, and a run that reports the gap it dials."""

from __future__ import annotations

import json

import pytest
import torch

from harness.config import validate
from harness.core.errors import ConfigError
from harness.runtime.rollout.quant import fake_quantize, quantized


def test_int8_fp8_int4_int3_per_row_by_hand():
    """Row 0 [1, -0.5, 0.25, 0.003]: int8 steps of 1/127 -> 1, -64/127 (-63.5 rounds to even), 32/127, 0; fp8 scales
    the row to 448 (448, -224, 112, 1.344 in e4m3: 1.344 -> 1.375, 3 mantissa bits) and back. Row 1 is scaled by
    its own max (per output channel): int8 steps of 2/127 (1 -> 63.5 steps, rounded to even: 64), fp8 exact."""
    w = torch.tensor([[1.0, -0.5, 0.25, 0.003], [2.0, 1.0, 0.0, 0.0]])
    int8 = fake_quantize(w, "int8")
    assert torch.allclose(int8[0], torch.tensor([1.0, -64 / 127, 32 / 127, 0.0]), atol=1e-7)
    assert torch.allclose(int8[1], torch.tensor([2.0, 128 / 127, 0.0, 0.0]), atol=1e-7)
    fp8 = fake_quantize(w, "fp8")
    assert torch.allclose(fp8[0], torch.tensor([1.0, -0.5, 0.25, 1.375 / 448]), atol=1e-7)
    assert torch.equal(fp8[1], w[1])
    assert fake_quantize(w, "none") is w and torch.equal(fake_quantize(w[0], "int8"), w[0])  # 1-D: left alone
    assert fake_quantize(w.to(torch.bfloat16), "int8").dtype == torch.bfloat16
    assert torch.allclose(fake_quantize(w, "int4")[0], torch.tensor([1.0, -3 / 7, 2 / 7, 0.0]), atol=1e-7)  # -0.5 / (1/7) rounds to -3.4999999
    int3 = fake_quantize(w, "int3")  # 3 steps a side: -0.5 / (1/3) and 1 / (2/3) are 1.5 steps, rounded to even: 2
    assert torch.allclose(int3, torch.tensor([[1.0, -2 / 3, 1 / 3, 0.0], [2.0, 4 / 3, 0.0, 0.0]]), atol=1e-7)
    with pytest.raises(ValueError, match="rollout.weight_quant='int2'"):
        fake_quantize(w, "int2")
    assert quantized("model.layers.0.mlp.down_proj.weight") and not quantized("model.embed_tokens.weight")
    assert not quantized("model.layers.0.self_attn.q_proj.bias") and not quantized("lm_head.weight")


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_the_engine_holds_the_quantized_matrices_and_the_exact_rest(kind, monkeypatch):
    from harness.models import new_qwen2, train_tokenizer
    from harness.runtime.rollout.fingerprint import compare
    from harness.runtime.rollout.hf import HFRollout

    torch.manual_seed(0)
    tok = train_tokenizer(["1 + 2 = 3", "4 + 5 = 9"], 60)
    model = new_qwen2(tok, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2)
    state = {k: v.clone() + 0.01 for k, v in model.state_dict().items()}
    engine = HFRollout(model, tok)
    engine.weight_quant, engine.verify_sync = kind, True
    engine.load_weights(state)
    held = dict(engine.model.named_parameters())
    for name, value in state.items():
        if name not in held:
            continue
        want = fake_quantize(value, kind) if quantized(name) else value
        assert torch.equal(held[name].detach(), want), name
    assert any(quantized(n) and not torch.equal(held[n].detach(), v) for n, v in state.items() if n in held)
    report = compare(engine.sent_fingerprints, engine.weight_fingerprints())  # the sync check sees what was sent
    assert report.mismatched == () and report.max_rel_err == 0.0


def test_the_dial_is_an_hf_setting_reported_like_a_mismatch(compose_cfg):
    validate(compose_cfg(["rollout.weight_quant=int8", "correction.name=tis"]))  # its log-probs reach the trainer
    with pytest.raises(ConfigError, match=r"rollout.weight_quant='int2': use none, int8, fp8, int4, int3"):
        validate(compose_cfg(["rollout.weight_quant=int2"]))
    with pytest.raises(ConfigError, match=r"rollout.weight_quant=fp8 is read by the hf engine only; rollout=vllm ignores it"):
        validate(compose_cfg(["rollout=vllm", "rollout.weight_quant=fp8"]))


@pytest.mark.integration
def test_an_int8_rollout_reports_a_gap_the_fp32_one_does_not(tmp_path):
    from harness.commands.cli import main

    main(["run", "trainer.steps=2", "trainer.prompts_per_step=4", "trainer.eval_every=100", "runtime.threads=1",
          "rollout.weight_quant=int8", f"run_dir={tmp_path / 'int8'}"])  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "int8" / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["rollout/logp_gap_mean"] for r in rows if "rollout/logp_gap_mean" in r]
    assert len(gaps) == 2 and min(gaps) > 1e-4
    assert all(r["mismatch/k3"] > 0 and 0 < r["mismatch/ess"] <= 1 for r in rows if "mismatch/k3" in r)
