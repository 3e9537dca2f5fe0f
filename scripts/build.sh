#!/usr/bin/env bash
# Configures and builds gpipe (Release) against one LibTorch (scripts/libtorch.sh: build/ for the
# torch wheel's, build-debian/ for Debian's). Arguments name the targets to build (default: all);
# GPIPE_CMAKE_ARGS adds configure options.
#
#   [GPIPE_LIBTORCH=wheel|debian] bash scripts/build.sh [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch.sh
libtorch=$(gpipe_libtorch)
dir=$(gpipe_build_dir "$libtorch")
# shellcheck disable=SC2046,SC2086  # word splitting of the argument lists is intended
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release $(gpipe_cmake_args "$libtorch") \
  ${GPIPE_CMAKE_ARGS:-} >/dev/null
targets=()
for target in "$@"; do targets+=(--target "$target"); done
cmake --build "$dir" ${targets[@]+"${targets[@]}"}
