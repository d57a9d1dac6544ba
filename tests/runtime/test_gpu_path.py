"""The GPU path, checked on CPU (issue #29): what would fail silently on a user's first GPU run.

No GPU runs here: where a CUDA or vLLM call is needed, a stand-in records the calls (labelled
below); everything else is the real code.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from harness.runtime.train.checkpoint_files import read_engine_state
from harness.runtime.workers.local import ProcessGroup, rank_devices


def test_each_worker_process_sees_its_own_gpu(monkeypatch):
    """Process launcher, 2 workers on a 2-GPU machine: CUDA_VISIBLE_DEVICES is one GPU per rank, so
    vLLM's engine (device 0 of what it sees) and the trainer share that rank's GPU, not GPU 0."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # the GPUs SLURM (or the user) gave this job
    devices = rank_devices(2, "cuda")
    assert devices == ["3", "5"]
    group = ProcessGroup(2, (), 1, devices, worker_cls="helpers:EnvReporter")  # a stub worker: no CUDA here
    try:
        seen = group.call("report", [(), ()])
    finally:
        group.close()
    assert [s["CUDA_VISIBLE_DEVICES"] for s in seen] == ["3", "5"]
    assert [s["RANK"] for s in seen] == ["0", "1"]


def test_rank_devices_on_cpu_and_too_few_gpus(monkeypatch):
    from harness.core.errors import ConfigError

    assert rank_devices(2, "cpu") == [None, None]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert rank_devices(2, "auto") == [None, None]  # no GPU visible: the CPU run's environment is kept
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(ConfigError, match="one GPU per worker"):
        rank_devices(2, "cuda")


def test_cuda_cache_is_released_before_every_vllm_build_and_wake(monkeypatch):
    """vLLM measures free device memory when it is built and re-allocates when it wakes: the
    trainer's cached blocks must be handed back first. Stand-ins (no GPU, no vLLM needed): torch.cuda's
    availability and empty_cache, and a vllm module whose LLM records its calls."""
    from harness.runtime.rollout import vllm as rollout_vllm

    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("release"))

    class FakeLLM:  # records what the rollout backend asks of vLLM
        def __init__(self, **kwargs):
            calls.append("build")
            config = types.SimpleNamespace(dtype=torch.float32, hf_config=types.SimpleNamespace(tie_word_embeddings=False))
            self.llm_engine = types.SimpleNamespace(model_config=config)

        def sleep(self, level):
            calls.append("sleep")

        def wake_up(self, tags=None):
            calls.append("wake" + (f":{','.join(tags)}" if tags else ""))

        def collective_rpc(self, method, args=()):
            return [0.0]

        def reset_prefix_cache(self):
            pass

    fake = types.ModuleType("vllm")
    fake.LLM = FakeLLM
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: False)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    tokenizer = types.SimpleNamespace(eos_token_id=1, pad_token_id=0)
    engine = rollout_vllm.VLLMRollout("/nonexistent", tokenizer, enable_sleep_mode=True, weight_transport="rpc")
    engine.sleep()
    engine.load_weights({"w": torch.zeros(2)})  # wakes weights, loads, wakes the KV cache
    engine.sleep()
    engine.wake_up()
    assert calls == ["release", "build", "sleep", "release", "wake:weights", "release", "wake:kv_cache", "sleep",
                     "release", "wake"]  # fmt: skip


@pytest.mark.integration
def test_bf16_preset_settings_move_the_master_weights(tmp_path):
    """sweeps/gsm8k_qwen0.5b.yaml's precision settings (model.dtype=bfloat16, trainer.lr=1e-6) on the
    tiny model: between two checkpoints one step apart, > 99% of a decoder matrix's entries move in
    the trained (master) copy. With bf16 masters, 0.77% moved: AdamW's ~1e-6 steps round away."""
    from harness.commands.cli import main

    run_dir = tmp_path / "bf16"
    main(["run", "model.dtype=bfloat16", "trainer.precision=bf16", "trainer.lr=1e-6", "trainer.steps=2",
          "trainer.checkpoint_every=1", "trainer.eval_every=2", "task.eval_prompts=8", "trainer.prompts_per_step=8",
          "runtime.threads=1", f"run_dir={run_dir}"])  # fmt: skip
    states = [read_engine_state(run_dir / "checkpoints" / f"step_{s:07d}") for s in (1, 2)]
    name = "model.layers.0.mlp.up_proj.weight"
    before, after = (s["policy"]["model"][name] for s in states)
    assert before.dtype == torch.float32  # the master copy
    moved = (after != before).float().mean().item()
    assert moved > 0.99, f"{moved:.2%} of {name} moved in one step at lr 1e-6"


def test_ray_actors_get_the_drivers_nccl_and_hf_settings():
    pytest.importorskip("ray")
    from harness.runtime.workers.ray_actors import actor_env

    env = actor_env({"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                     "HF_HOME": "/scratch/hf", "HOME": "/root", "PATH": "/bin", "GLOO_SOCKET_IFNAME": "eth1"})  # fmt: skip
    assert env == {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                   "HF_HOME": "/scratch/hf", "GLOO_SOCKET_IFNAME": "eth1"}  # fmt: skip


def test_threads_follow_the_cpu_affinity_not_the_machine(monkeypatch, compose_cfg):
    import os

    from harness.runtime.workers import local as workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})  # e.g. SLURM's --cpus-per-task=6
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    assert workers.worker_threads(0, 2) == 3  # runtime.threads=0: the cores this process may use, shared out
    assert workers.worker_threads(4, 2) == 4


def test_tf32_is_enabled_for_gpu_runs():
    from harness.runtime.train.fsdp import enable_tf32

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        enable_tf32()
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_colocated_vllm_refuses_tensor_parallel(compose_cfg):
    from harness.config import validate
    from harness.core.errors import ConfigError

    cfg = compose_cfg(["rollout=vllm", "rollout.vllm.tensor_parallel_size=2"])
    with pytest.raises(ConfigError, match="tensor_parallel_size=2: a colocated vLLM engine"):
        validate(cfg)
    validate(cfg, serving=True)  # a rollout server's engine may span GPUs


def test_a_hub_id_is_fetched_once_by_the_driver_and_offline_fails_in_one_line(monkeypatch):
    from harness.core.errors import ModelError
    from harness.runtime import loading as hf

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="model.path=no-such-org/no-such-model: cannot load its files"):
        hf.local_snapshot("no-such-org/no-such-model")


def test_gradient_checkpointing_gives_the_same_gradients():
    """trainer.gradient_checkpointing: backward recomputes each layer; log-probs and gradients equal
    the stored-activation pass (a tiny Qwen2, fp32)."""
    from types import SimpleNamespace

    from transformers import Qwen2Config, Qwen2ForCausalLM

    from harness.runtime.train.fsdp import TrainEngine, init_distributed

    init_distributed("cpu")
    config = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip
    optim = SimpleNamespace(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, warmup_steps=0, grad_clip=0.0)
    gen = torch.Generator().manual_seed(0)
    batch = SimpleNamespace(prompt_ids=torch.randint(0, 64, (3, 5), generator=gen), prompt_mask=torch.ones(3, 5, dtype=torch.bool),
                            response_ids=torch.randint(0, 64, (3, 7), generator=gen),
                            response_mask=torch.ones(3, 7, dtype=torch.bool))  # fmt: skip
    grads = {}
    for ckpt in (False, True):
        torch.manual_seed(0)
        engine = TrainEngine(Qwen2ForCausalLM(config), "cpu", "fp32", optim, checkpointing=ckpt)
        logp, _ = engine.forward(batch)
        logp.sum().backward()
        grads[ckpt] = (logp.detach(), {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                                       for n, p in engine.model.named_parameters()})  # fmt: skip
    assert engine.checkpointing and not engine.share_prompts
    torch.testing.assert_close(grads[True][0], grads[False][0])
    for name, g in grads[False][1].items():
        torch.testing.assert_close(grads[True][1][name], g, rtol=1e-5, atol=1e-7, msg=name)


def test_the_vllm_window_defaults_to_what_the_run_needs(monkeypatch, compose_cfg):
    """rollout.vllm.max_model_len=0 gives the engine task.max_prompt_tokens + the longer response cap, not the model's
    own limit (131k for Qwen2.5-7B, whose KV cache a colocated engine's share may not hold for one sequence); a set
    value is passed as it is."""
    from harness.config import runtime_settings
    from harness.runtime.rollout import vllm as backend
    from harness.runtime.workers.worker import rollout_context

    seen = {}
    monkeypatch.setattr(backend, "VLLMRollout", lambda *a, **kw: seen.update(kw))
    for extra, want in (([], 128 + 300), (["rollout.vllm.max_model_len=4096"], 4096)):
        cfg = compose_cfg(["rollout=vllm", "task.max_prompt_tokens=128", "rollout.max_response_tokens=200",
                           "rollout.eval_max_response_tokens=300", *extra])
        settings = runtime_settings(cfg).worker(return_logp=False)
        backend.build(rollout_context(settings, "/m", None, "cpu"))
        assert seen["max_model_len"] == want


class EnvWorker:
    """A stand-in worker for the launcher tests: reports its process's compile-cache variables."""

    def __init__(self, *_):
        pass

    def env(self, names: tuple[str, ...]) -> dict[str, str | None]:
        import os

        return {n: os.environ.get(n) for n in names}

    def close(self) -> None:
        pass


def test_every_worker_rank_gets_its_own_compile_caches(monkeypatch, tmp_path):
    """Spawned local workers (and Ray actors, through RayWorker.setup) each compile into
    $HARNESS_CACHE/compile/rank<R>/: engines compiling at once into one cache race (vllm#24601)."""
    from harness.runtime.workers.local import COMPILE_CACHE_VARS, ProcessGroup

    for var in COMPILE_CACHE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path))
    group = ProcessGroup(2, (), threads=1, worker_cls="tests.runtime.test_gpu_path:EnvWorker")
    try:
        envs = group.call("env", [(tuple(COMPILE_CACHE_VARS),)] * 2)
    finally:
        group.close()
    assert envs[0]["VLLM_CACHE_ROOT"] == str(tmp_path / "compile" / "rank0" / "vllm")
    assert envs[1]["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile" / "rank1" / "inductor")
    assert len({e[v] for e in envs for v in COMPILE_CACHE_VARS}) == 6  # no directory shared

    import harness.runtime.workers.worker as worker_module
    from harness.runtime.workers.ray_actors import RayWorker

    monkeypatch.setattr(worker_module, "Worker", EnvWorker)
    actor = RayWorker()
    actor.setup({"RANK": "3"}, 1, ())
    import os

    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "compile" / "rank3" / "triton")
    for var in (*COMPILE_CACHE_VARS, "RANK"):  # setup wrote this process's environment
        os.environ.pop(var, None)
