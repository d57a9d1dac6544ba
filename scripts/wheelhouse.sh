#!/usr/bin/env bash
# Wheelhouse for scripts/gpu_check.sh on a GPU machine with no network (docs/scale.md, GPU readiness).
#
#   scripts/wheelhouse.sh [DIR]      # default .whl (git-ignored); needs PyPI here, nothing there
#
# The GPU machine's image (Python 3.12, torch, transformers, tokenizers, safetensors, peft, pandas,
# numpy, rich, pyyaml, ...) lacks only what the config layer imports: hydra-core, omegaconf and its
# pinned ANTLR runtime (checked in a venv holding just the image's packages: with these three,
# `bench/gpu_check.py --cpu --shape tiny --rollout hf` passes), and pytest for the vLLM contract test. The harness itself is not packaged:
# gpu_check.sh puts the repo on PYTHONPATH. Every wheel is pure Python (py3-none-any), so the
# Python here (3.11) may differ from the GPU machine's (3.12). Versions: the ones in .venv.
# DIR/tokenizers/qwen2 gets the shared Qwen2 tokenizer (when ../shared/data has it), so the
# qwen0.5b shape keeps its real vocabulary (151936) there. Prints the total size (limit 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY=${PYTHON:-python3}
# pytest and the two dependencies the image lacks (it has packaging and pygments): gpu_check's contract stage runs tests/runtime/test_vllm_contract.py
PINS=(hydra-core==1.3.8 omegaconf==2.3.1 pytest==9.1.1 pluggy==1.7.0 iniconfig==2.3.1)
ANTLR=antlr4-python3-runtime==4.9.3  # omegaconf 2.3 needs 4.9.*, which PyPI has as an sdist only
mkdir -p "$DIR"
rm -f "$DIR"/*.whl
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any --dest "$DIR" "${PINS[@]}" 2> >(grep -v "is ignored" >&2)
# Built here from its sdist: pure Python, so the wheel is py3-none-any.
"$PY" -m pip wheel --quiet --no-deps --no-binary=:all: --wheel-dir "$DIR" "$ANTLR" 2> >(grep -v "is ignored" >&2)
for w in "$DIR"/*.whl; do
  case "$w" in *-py3-none-any.whl|*-cp312-*.whl|*-abi3-*.whl) ;;
    *) echo "wheelhouse: $w is neither pure Python nor for CPython 3.12" >&2; exit 1 ;;
  esac
done
TOK=""
for t in shared/data/tokenizers/qwen2 ../shared/data/tokenizers/qwen2; do
  if [ -f "$t/vocab.json" ]; then TOK=$t; break; fi
done
if [ -n "$TOK" ]; then
  rm -rf "$DIR/tokenizers/qwen2" && mkdir -p "$DIR/tokenizers/qwen2" && cp "$TOK"/* "$DIR/tokenizers/qwen2/"
  chmod -R u+w "$DIR/tokenizers"
else
  echo "wheelhouse: no Qwen2 tokenizer found (shared/data/tokenizers/qwen2); gpu_check will train a small BPE one" >&2
fi
ls -l "$DIR"/*.whl | awk '{print "  " $5 "\t" $NF}'
[ -n "$TOK" ] && echo "  $(du -sb "$DIR/tokenizers" | cut -f1)	$DIR/tokenizers/qwen2 (from $TOK)"
bytes=$(du -sb "$DIR" | cut -f1)
echo "wheelhouse $DIR: $(ls "$DIR"/*.whl | wc -l) wheels, $bytes bytes ($((bytes / 1024)) KiB) in all"
if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
  echo "wheelhouse: over 64 MiB, too large to carry" >&2
  exit 1
fi
