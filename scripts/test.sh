#!/usr/bin/env bash
# On a fresh Debian 12 machine: installs what is needed, then builds everything and runs every
# test against both LibTorch configurations (scripts/libtorch.sh): the torch wheel's LibTorch
# 2.11 with CUDA (*_CUDA tests skip without a GPU; then the GPU check's part that runs without
# one), and Debian's LibTorch 1.13 (CPU). Among the tests: each public header compiles alone, and
# a user's project builds on the installed package. About 33 minutes on 2 cores from scratch.
#
#   bash scripts/test.sh [wheel|debian ...]     (default: wheel debian)
set -euo pipefail
cd "$(dirname "$0")/.."
configurations=("$@")
if ((${#configurations[@]} == 0)); then configurations=(wheel debian); fi

for libtorch in "${configurations[@]}"; do
  export GPIPE_LIBTORCH=$libtorch
  source scripts/libtorch.sh
  dir=$(gpipe_build_dir "$(gpipe_libtorch)")
  start=$SECONDS
  echo "== $libtorch: setup"
  bash scripts/setup.sh
  echo "== $libtorch: build in $dir/ ($((SECONDS - start)) s)"
  bash scripts/build.sh
  echo "== $libtorch: tests ($((SECONDS - start)) s)"
  ctest --test-dir "$dir" --output-on-failure -j2
  if [[ "$libtorch" == wheel ]]; then
    echo "== $libtorch: the GPU check without a GPU"
    bash scripts/gpu-check.sh --python "$(gpipe_venv)/bin/python" --build-dir "$dir" \
      --out "$dir/gpu-check" --allow-no-gpu
  fi
  echo "== $libtorch: done in $((SECONDS - start)) s"
done
