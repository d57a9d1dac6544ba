#!/usr/bin/env bash
# Create the virtualenv (if absent) and install harness with its dev extras.
# Where there is no GPU, torch comes as the CPU build (a local wheel if pip's
# find-links holds one, else PyTorch's CPU index), so no multi-GB CUDA download.
# uv installs (in parallel: about half pip's time on 2 cores); plain pip if uv cannot be installed.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev,slurm,ray,trackers}
STAMP="$VENV/.installed-$(sha1sum pyproject.toml | cut -c1-12)-$EXTRAS"
[ -f "$STAMP" ] && exit 0

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip
# The CPU torch wheel on local disk, if pip's config names a find-links folder holding one (uv reads no pip config)
WHEELS=$($PIP config get global.find-links 2>/dev/null || true)
if $PIP install --quiet uv 2>/dev/null; then
  # --compile-bytecode: pip's default; without it, every process compiles torch and transformers again
  # where PYTHONDONTWRITEBYTECODE is set
  INSTALL="$VENV/bin/uv pip install --quiet --python $VENV/bin/python --compile-bytecode ${WHEELS:+--find-links $WHEELS}"
else
  INSTALL="$PIP install --quiet"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    $PIP install --quiet "torch>=2.6,<=2.14.1"
  elif [ -n "$WHEELS" ] && ls "$WHEELS"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
    $INSTALL "torch==2.13.0"          # the CPU wheel on local disk
  else
    $PIP install --quiet torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
$INSTALL -e ".[$EXTRAS]"
# rliable (suite aggregates, analysis/suite.py) pins arch<8, whose 7.x fails to import under pandas 3:
# installed without its pins; pyproject.toml holds the rest of what it needs (arch>=8, absl-py).
$INSTALL --no-deps "rliable==1.2.0"
rm -f "$VENV"/.installed-*
touch "$STAMP"
