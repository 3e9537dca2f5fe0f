#!/usr/bin/env bash
# On a fresh Debian 12 machine: installs what is needed, then builds and runs the tests against
# both LibTorch configurations (scripts/libtorch.sh):
#   wheel   the torch wheel's LibTorch 2.11 with CUDA, the main build: everything - library,
#           tools, examples, benchmarks, every test (*_CUDA ones skip without a GPU), each public
#           header alone, a user's project on the installed package - then the GPU check's part
#           that runs without a GPU;
#   debian  Debian's LibTorch 1.13 (CPU), the second: the library, tools and examples, and the
#           tests of what differs between LibTorch versions (GPIPE_COMPAT_TESTS).
# About 30 minutes on 2 cores from a fresh clone, once the downloads are cached.
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
    GPIPE_CMAKE_ARGS="-DGPIPE_COMPAT_TESTS=ON -DGPIPE_BUILD_BENCHMARKS=OFF" bash scripts/build.sh
  else
    bash scripts/build.sh
  fi
  echo "== $libtorch: tests ($((SECONDS - start)) s)"
  ctest --test-dir "$dir" --output-on-failure -j2
  if [[ "$libtorch" == wheel ]]; then
    echo "== $libtorch: the GPU check without a GPU ($((SECONDS - start)) s)"
    bash scripts/gpu-check.sh --python "$(gpipe_venv)/bin/python" --build-dir "$dir" \
      --out "$dir/gpu-check" --allow-no-gpu
  fi
  echo "== $libtorch: done in $((SECONDS - start)) s"
done
