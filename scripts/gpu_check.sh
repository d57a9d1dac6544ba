#!/usr/bin/env bash
# GPU check, pass/fail with thresholds (bench/gpu_check.py; docs/scale.md, GPU readiness): a random-init
# Qwen2.5-0.5B-shaped model, GRPO with an entropy bonus at the GPU presets' precision (bf16 compute,
# lr 1e-6) with rollout=vllm (hf when vllm does not import): weights move in the fp32 masters, the
# engine holds exactly what each sync sent, each phase's memory is within 25% of `harness plan`, the
# log-prob gap stays bounded; GRPO from the shipped reasoning warm start raises eval accuracy in bf16;
# vLLM wakes beside a trainer that had a cached peak; with 2+ GPUs, one GPU per worker. Exit status:
# the number of failed checks. Under 10 min on one GPU (the stages before warmstart: 87 s on an H200).
#
#   scripts/gpu_check.sh [--help] [--steps 4] [--max-new 128] [--skip learning,plan,sync,warmstart,contract,memory,workers,fakerank] [OVERRIDES...]
#
# Environment: PYTHON (default: .venv/bin/python if present, else python3);
# INSTALL=1 installs the project with its vllm extra first (needs network access);
# WHEELHOUSE (default .whl when it exists; scripts/wheelhouse.sh makes it): its wheels are installed
# offline (--no-index --no-deps) into HARNESS_SITE (default $TMPDIR/harness-site), put on PYTHONPATH,
# and its tokenizers/qwen2 is passed as --tokenizer, so a bare CUDA image with torch + transformers
# and no network runs the check. Without vLLM the check runs with --rollout hf and says which stages
# that skips. PYTHONUNBUFFERED is set so logs stream. All arguments go to bench/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
case " $* " in
  *" --help "*|*" -h "*) exec "$PYTHON" bench/gpu_check.py --help ;;
esac
if [ "${INSTALL:-0}" = 1 ]; then
  "$PYTHON" -m pip install --quiet -e ".[vllm,dev]"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
else
  echo "warning: nvidia-smi not found; this check is meant for a GPU machine" >&2
fi
# The repo first, always: `python -c "import harness"` run here would find ./harness and say nothing.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
WHEELHOUSE=${WHEELHOUSE:-$([ -d .whl ] && echo .whl || true)}
extra=()
if [ -n "$WHEELHOUSE" ]; then
  shopt -s nullglob
  wheels=("$WHEELHOUSE"/*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -gt 0 ]; then
    site=${HARNESS_SITE:-${TMPDIR:-/tmp}/harness-site}
    rm -rf "$site"
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --disable-pip-version-check \
      --target "$site" "${wheels[@]}"
    export PYTHONPATH="$PWD:$site${PYTHONPATH#"$PWD"}"
    echo "wheelhouse $WHEELHOUSE: ${#wheels[@]} wheels installed offline into $site"
  fi
  case " $* " in
    *" --tokenizer "*|*" --tokenizer="*) ;;
    *) if [ -f "$WHEELHOUSE/tokenizers/qwen2/vocab.json" ]; then extra+=(--tokenizer "$WHEELHOUSE/tokenizers/qwen2"); fi ;;
  esac
fi
exec "$PYTHON" bench/gpu_check.py "${extra[@]}" "$@"
