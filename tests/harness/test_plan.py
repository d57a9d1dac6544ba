"""harness plan (harness/plan.py): parameter counts, LoRA sizes, and the rehearsal's measured peak RSS."""

from __future__ import annotations

import pytest

import algorithms
from harness.models import ModelShape
from harness.plan import GIB, lora_parameters, plan

QWEN25_05B = ModelShape(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, tied=True)


def test_parameter_count_equals_the_model_built_from_the_shape():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = ModelShape(hidden=128, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=300, tied=True)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=300, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert QWEN25_05B.parameters == 494_032_768  # Qwen2.5-0.5B's published 494M


def test_lora_parameters_equal_peft_on_the_tiny_model():
    # tests/runtime/test_lora.py measures 45,056 trainable adapter parameters at rank 8 on the tiny model
    tiny = ModelShape(hidden=128, intermediate=512, layers=2, heads=4, kv_heads=2, vocab=14, tied=True)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert lora_parameters(tiny, 8, targets) == 45_056


# The dress rehearsal (docs/scale.md, bench/rehearsal.py): GSM8K prompts (longest 165 tokens with the
# Qwen2 chat template), 512-token responses, 2 prompts x 2 samples, micro-batches of 2, fp32, CPU.
REHEARSAL = ["task=gsm8k", "rollout.max_response_tokens=512", "trainer.prompts_per_step=2", "algo.samples_per_prompt=2",
             "trainer.micro_batch_sequences=2"]  # fmt: skip


# Measured 2026-12-01 (session 10, chunked log-probs), docs/scale.md.
@pytest.mark.parametrize("overrides, measured_gib", [
    (["algo=grpo"], 18.44),  # 1 worker, full fine-tuning, KL reference
    (["algo=grpo", "model.lora.rank=8", "runtime.workers=2"], 11.15),  # per worker (10.95 / 11.35)
    (["algo=grpo", "model.lora.rank=8", "rollout=vllm"], 12.83),  # the driver: trainer + vLLM's client
    # PPO, LoRA on policy and critic, bf16 weights (from the fp32 checkpoint), micro 1: workers 9.69 / 10.45
    (["algo=ppo", "model.lora.rank=8", "model.lora.roles=[critic]", "runtime.workers=2", "model.dtype=bfloat16",
      "trainer.micro_batch_sequences=1"], 10.07),
])  # fmt: skip
def test_plan_is_within_25_percent_of_the_rehearsals_peak_rss(compose_cfg, overrides, measured_gib):
    cfg = compose_cfg([*REHEARSAL, *overrides])
    result = plan(cfg, list(algorithms.build(cfg.algo).needs.roles), QWEN25_05B, prompt_tokens=165)
    predicted = result["worker_total_bytes"] / GIB
    assert abs(predicted / measured_gib - 1) <= 0.25, f"predicted {predicted:.2f} GiB, measured {measured_gib} GiB"


def test_plan_of_the_vllm_rehearsal_on_two_workers(compose_cfg):
    """GRPO + LoRA r8, bf16 weights, a bf16 vLLM engine per worker with a 0.5 GiB KV cache, micro-batches
    of 1 (docs/scale.md, 2026-12-01, session 10): training workers 7.29 / 7.42 GiB, vLLM worker processes
    3.51 / 3.50."""
    cfg = compose_cfg([*REHEARSAL, "algo=grpo", "model.lora.rank=8", "runtime.workers=2", "rollout=vllm",
                       "trainer.micro_batch_sequences=1", "model.dtype=bfloat16", "rollout.vllm.dtype=bfloat16",
                       "rollout.vllm.kv_cache_gib=0.5"])  # fmt: skip
    result = plan(cfg, list(algorithms.build(cfg.algo).needs.roles), QWEN25_05B, prompt_tokens=165)
    worker, engine = result["worker_total_bytes"] / GIB, sum(result["engine_bytes"].values()) / GIB
    assert abs(worker / 7.36 - 1) <= 0.25, f"training worker: predicted {worker:.2f} GiB, measured 7.36"
    assert abs(engine / 3.5 - 1) <= 0.25, f"vLLM engine: predicted {engine:.2f} GiB, measured 3.5"


def test_plan_of_an_fp32_vllm_engine(compose_cfg):
    """The vLLM worker process of the 1-worker vllm rehearsal (fp32, 1 GiB KV cache): 4.45 GiB measured."""
    cfg = compose_cfg([*REHEARSAL, "algo=grpo", "model.lora.rank=8", "rollout=vllm"])
    result = plan(cfg, list(algorithms.build(cfg.algo).needs.roles), QWEN25_05B, prompt_tokens=165)
    engine = sum(result["engine_bytes"].values()) / GIB
    assert abs(engine / 4.45 - 1) <= 0.25, f"vLLM engine: predicted {engine:.2f} GiB, measured 4.45"


def test_plan_command_says_whether_it_fits(capsys):
    from harness.commands.cli import main

    main(["plan", "algo=ppo", "--device-gib", "0.5"])
    out = capsys.readouterr().out
    assert "critic (trained)" in out and "total (peak estimate)" in out and "does NOT fit in 0.5 GiB" in out
    with pytest.raises(SystemExit, match="config.json"):
        main(["plan", "model.path=/nonexistent/model"])


def test_vllm_on_a_gpu_with_sleep_mode_needs_the_larger_phase_not_the_sum(compose_cfg):
    from harness.plan import render

    cfg = compose_cfg(["algo=grpo", "rollout=vllm", "runtime.device=cuda", "rollout.vllm.gpu_memory_utilization=0.4"])
    result = plan(cfg, list(algorithms.build(cfg.algo).needs.roles), QWEN25_05B, device_gib=80)
    engine = sum(result["engine_bytes"].values()) / GIB
    assert engine == pytest.approx(32.0) and result["engine_sleeps"]
    need = max(result["worker_total_bytes"] / GIB, engine + 1.0)
    assert f"({need:.2f} GiB needed per worker (" in render(result, 80)
    assert "vllm engine 32.00 GiB awake beside the trainer's" in render(result, 80)
    awake = compose_cfg(["algo=grpo", "rollout=vllm", "runtime.device=cuda", "rollout.vllm.enable_sleep_mode=false"])
    result = plan(awake, list(algorithms.build(awake.algo).needs.roles), QWEN25_05B, device_gib=80)
    assert f"+ vllm engine {sum(result['engine_bytes'].values()) / GIB:.2f} GiB)" in render(result, 80)


QWEN25_MATH_15B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                   "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}  # fmt: skip
QWEN25_05B_CONFIG = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}  # fmt: skip


def _preset_plan(compose_cfg, tmp_path, preset: str, shape: dict, extra=()):
    import json

    from harness.commands.presets import read_preset, resolve_preset

    (tmp_path / preset).mkdir()
    (tmp_path / preset / "config.json").write_text(json.dumps(shape))
    cfg = compose_cfg([*read_preset(resolve_preset(preset))["overrides"], "algo=grpo", f"model.path={tmp_path / preset}",
                       *extra])  # fmt: skip
    return plan(cfg, list(algorithms.build(cfg.algo).needs.roles), device_gib=141)


def test_plan_of_the_gpu_presets_by_hand(compose_cfg, tmp_path):
    """The two GPU presets, every term computed here by hand: fp32 masters, gradients and moments
    under bf16 compute, a bf16 frozen reference, the sync's largest tensor cast to vLLM's bf16 before it is
    gathered, bf16 logits + their gradient, bf16 activations
    (checkpointed on the MATH preset), and the rollout phase = vLLM's share of the device beside
    the trainer's models and optimizer state (vLLM sleeps while the trainer runs)."""
    from harness.plan import ACT_HIDDEN, ACT_INTERMEDIATE, LOGP_CHUNK_BYTES, PROCESS_OVERHEAD_GIB

    # gsm8k_qwen0.5b: grpo with kl 0.001 (a frozen reference), 1 worker, micro-batch 16 x (512 + 512) tokens
    r = _preset_plan(compose_cfg, tmp_path, "gsm8k_qwen0.5b", QWEN25_05B_CONFIG)
    p = 494_032_768
    hand = {"parameters (policy, FSDP shard)": 4 * p, "gradients": 4 * p, "optimizer (AdamW moments)": 8 * p,
            "reference (frozen copy)": 2 * p, "weight sync (largest gathered tensor)": 2 * 151936 * 896,  # cast, then gathered
            "logits (one micro-batch) and their gradient": 2 * 16 * 512 * 151936 * 2 + LOGP_CHUNK_BYTES,
            "layer activations (one micro-batch)": 16 * 1024 * 24 * 2 * (ACT_HIDDEN * 896 + ACT_INTERMEDIATE * 4864),
            "process overhead": PROCESS_OVERHEAD_GIB * GIB}  # fmt: skip
    assert r["worker_bytes"] == pytest.approx(hand)
    assert r["worker_persistent_bytes"] == pytest.approx(14 * p + PROCESS_OVERHEAD_GIB * GIB)
    assert r["engine_sleeps"] and r["engine_bytes"] == pytest.approx({
        "rollout.vllm.gpu_memory_utilization x device (weights + KV cache)": 0.4 * 141 * GIB})

    # math_qwen1.5b: grpo without KL (no reference), micro-batch 8 x (1024 + 3000), checkpointed layers
    r = _preset_plan(compose_cfg, tmp_path, "math_qwen1.5b", QWEN25_MATH_15B)
    p = 151936 * 1536 + 28 * (1536 * 1536 * 2 + 2 * 1536 * 256 + 2 * 256 + 1536 + 3 * 1536 * 8960 + 2 * 1536) + 1536
    assert r["model_parameters"] == p
    one_layer = 8 * 4024 * 2 * (ACT_HIDDEN * 1536 + ACT_INTERMEDIATE * 8960)
    hand = {"parameters (policy, FSDP shard)": 4 * p, "gradients": 4 * p, "optimizer (AdamW moments)": 8 * p,
            "weight sync (largest gathered tensor)": 2 * 151936 * 1536,
            "logits (one micro-batch) and their gradient": 2 * 8 * 3000 * 151936 * 2 + LOGP_CHUNK_BYTES,
            "layer activations (checkpointed: layer inputs + one layer)": 8 * 4024 * 2 * 1536 * 28 + one_layer,
            "process overhead": PROCESS_OVERHEAD_GIB * GIB}  # fmt: skip
    assert r["worker_bytes"] == pytest.approx(hand)
    assert sum(hand.values()) / GIB < 0.5 * 141  # without checkpointing: 139.7 GiB, the whole device
    assert r["worker_persistent_bytes"] == pytest.approx(12 * p + PROCESS_OVERHEAD_GIB * GIB)


def test_several_workers_accumulating_micro_batches_keep_gradients_sharded(compose_cfg):
    """Gradients are reduce-scattered at every micro-batch's backward (bench/bench_rank_memory.py measured
    the unsharded ones this replaced): with 2 workers, each holds half of them, as of the moments."""
    cfg = compose_cfg(["algo=grpo", "runtime.workers=2", "trainer.prompts_per_step=8", "trainer.micro_batch_sequences=8",
                       "runtime.device=cpu"])  # 64 sequences: 32 per worker, 4 micro-batches each  # fmt: skip
    r = plan(cfg, [], QWEN25_05B)
    assert r["worker_bytes"]["gradients"] == 4 * QWEN25_05B.parameters / 2
    assert r["worker_bytes"]["optimizer (AdamW moments)"] == 8 * QWEN25_05B.parameters / 2


def test_fsdp_gathers_by_hand_at_8_ranks(compose_cfg):
    """What FSDP2 gathers during an update on each of 8 ranks, Qwen2.5-0.5B's shapes (tied embeddings): the root
    (embeddings 151936 x 896, the final norm) in bf16 under trainer.precision=bf16, two decoder layers, and the
    root's full fp32 gradient before its reduce-scatter; none of it kept between updates. One rank: none of it."""
    cfg = compose_cfg(["algo=grpo", "runtime.workers=8", "trainer.prompts_per_step=64", "trainer.precision=bf16",
                       "runtime.device=cpu"])  # fmt: skip
    r = plan(cfg, [], QWEN25_05B)
    root = 151936 * 896 + 896
    layer = (QWEN25_05B.parameters - root) / 24
    w = r["worker_bytes"]
    assert w["FSDP gathered root (embeddings, LM head, norm)"] == 2 * root
    assert w["FSDP gathered layers (one, and the next prefetched)"] == pytest.approx(2 * 2 * layer)
    assert w["FSDP reduce-scatter input (the root's full fp32 gradient)"] == 4 * root
    assert r["worker_persistent_bytes"] == pytest.approx(r["worker_total_bytes"] - sum(
        v for k, v in w.items() if k.startswith(("gradients", "logits", "layer activations", "weight sync", "FSDP"))))
    one = plan(compose_cfg(["algo=grpo", "trainer.precision=bf16", "runtime.device=cpu"]), [], QWEN25_05B)
    assert not any(k.startswith("FSDP") for k in one["worker_bytes"])


def test_hybrid_sharding_divides_by_the_shard_group_not_all_workers(compose_cfg):
    cfg = compose_cfg(["algo=grpo", "runtime.workers=4", "runtime.fsdp_shard_size=2", "trainer.prompts_per_step=8",
                       "runtime.device=cpu"])  # fmt: skip
    r = plan(cfg, [], QWEN25_05B)
    assert r["worker_bytes"]["optimizer (AdamW moments)"] == 8 * QWEN25_05B.parameters / 2  # 2 shards, not 4
