#!/usr/bin/env bash
# Create the virtualenv (if absent) and install harness with its dev extras.
# Where there is no GPU, torch comes as the CPU build (a local wheel if pip's
# find-links holds one, else PyTorch's CPU index), so no multi-GB CUDA download.
# uv installs (in parallel: about half pip's time on 2 cores); any step uv cannot do (uv not
# installable, no route to its index) falls back to pip with pip's own settings.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev,slurm,ray,trackers}
STAMP="$VENV/.installed-$(sha1sum pyproject.toml | cut -c1-12)-$EXTRAS"
[ -f "$STAMP" ] && exit 0

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip
GPU=$(command -v nvidia-smi >/dev/null 2>&1 && echo 1 || true)
# uv reads no pip config: pass it the first find-links folder (the CPU torch wheel on local disk, CPU
# machines only) and pip's constraints file, if pip has them.
WHEELS=${PIP_FIND_LINKS:-$($PIP config get global.find-links 2>/dev/null || true)}
WHEELS=$(echo "${WHEELS#file://}" | head -1 | cut -d' ' -f1)
CONSTRAINT=${PIP_CONSTRAINT:-$($PIP config get global.constraint 2>/dev/null || true)}
UV_ARGS=(--quiet --python "$VENV/bin/python" --compile-bytecode)  # compiled as pip does: PYTHONDONTWRITEBYTECODE may be set
[ -n "$WHEELS" ] && [ -z "$GPU" ] && UV_ARGS+=(--find-links "$WHEELS")
[ -n "$CONSTRAINT" ] && [ -f "$CONSTRAINT" ] && UV_ARGS+=(--constraint "$CONSTRAINT")
UV=$($PIP install --quiet uv >/dev/null 2>&1 && echo "$VENV/bin/uv" || true)
install() {  # install ARGS...: uv, else pip
  if [ -n "$UV" ]; then
    "$UV" pip install "${UV_ARGS[@]}" "$@" && return 0
    echo "uv could not install $*; pip instead" >&2
  fi
  $PIP install --quiet "$@"
}
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  PYTAG=$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  if [ -n "$GPU" ]; then
    $PIP install --quiet "torch>=2.6,<=2.14.1"
  elif [ -n "$WHEELS" ] && ls "$WHEELS"/torch-2.13.0+cpu-"$PYTAG"-*.whl >/dev/null 2>&1; then
    install "torch==2.13.0+cpu"          # the CPU wheel on local disk
  else
    $PIP install --quiet torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
install -e ".[$EXTRAS]"
# rliable (suite aggregates, analysis/suite.py) pins arch<8, whose 7.x fails to import under pandas 3:
# installed without its pins; pyproject.toml holds the rest of what it needs (arch>=8, absl-py).
install --no-deps "rliable==1.2.0"
rm -f "$VENV"/.installed-*
touch "$STAMP"
