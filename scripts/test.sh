#!/usr/bin/env bash
# On a fresh Debian 12 machine: installs what is needed, then builds and tests gpipe against both
# LibTorch configurations (scripts/libtorch.sh):
#   wheel:  LibTorch 2.11 with CUDA, the main build: everything, every test (*_CUDA tests skip
#           without a GPU), and the GPU check's part that runs without one.
#   debian: Debian's LibTorch 1.13 (CPU): the library, the examples and the core tests
#           (GPIPE_TESTS=core), to keep a clean run within CI's time.
# Both check each public header alone and a user's project on the installed package.
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
  if [[ "$libtorch" == debian ]]; then
    GPIPE_CMAKE_ARGS="-DGPIPE_TESTS=core -DGPIPE_BUILD_BENCHMARKS=OFF" bash scripts/build.sh
  else
    bash scripts/build.sh
  fi
  echo "== $libtorch: tests ($((SECONDS - start)) s)"
  ctest --test-dir "$dir" --output-on-failure -j2
  if [[ "$libtorch" == wheel ]]; then
    echo "== $libtorch: the GPU check without a GPU"
    bash scripts/gpu-check.sh --python "$(gpipe_venv)/bin/python" --build-dir "$dir" \
      --out "$dir/gpu-check" --allow-no-gpu
  fi
  echo "== $libtorch: done in $((SECONDS - start)) s"
done
