# The two set-up commands of the README. Each creates .venv if absent and installs.
VENV ?= .venv
export HF_HUB_OFFLINE ?= 1

.PHONY: run test test-fast bench install

install:
	VENV=$(VENV) scripts/install.sh

run: install           ## the main job: GRPO on the tiny offline model, arith task, CPU
	$(VENV)/bin/harness run

test: install          ## every test: the fast tier and the CPU integration tier
	$(VENV)/bin/python -m pytest -q

test-fast: install     ## the fast tier only
	$(VENV)/bin/python -m pytest -q -m "not integration"

bench: install         ## step-time split and rollout throughput vs raw model.generate
	$(VENV)/bin/python bench/bench_step.py
