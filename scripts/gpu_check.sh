#!/usr/bin/env bash
# GPU check: a few GRPO steps of a random-init ~0.5B Qwen2 with rollout=vllm, bf16 training;
# prints rollout tokens/s, weight-sync seconds, step-time split and peak GPU memory.
#
#   scripts/gpu_check.sh [--help] [--steps 4] [--n 8] [--max-new 256] [OVERRIDES...]
#
# Environment: PYTHON (default: .venv/bin/python if present, else python3);
# INSTALL=1 installs the project with its vllm extra first (needs network access);
# PYTHONUNBUFFERED is set so logs stream. All arguments go to bench/gpu_check.py.
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
"$PYTHON" -c "import harness" 2>/dev/null || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" bench/gpu_check.py "$@"
