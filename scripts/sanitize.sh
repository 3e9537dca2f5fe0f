#!/usr/bin/env bash
# Builds the library, the tools and the tests with AddressSanitizer and UndefinedBehaviorSanitizer
# and runs the tests, against one LibTorch configuration (scripts/libtorch.sh; default debian:
# CPU-only, so that nothing but LibTorch itself is out of the sanitizers' sight). Builds in
# build-sanitize-<configuration>/. Any report fails the run.
#
#   bash scripts/sanitize.sh [debian|wheel] [ctest arguments ...]
#
# Left out, and why: leak detection (LibTorch's registries are never freed, by design), the
# vptr check (LibTorch's types come from a library built without it: false reports), and the
# tests of packaging, which build other projects without these flags (the README's commands, the
# CMake option configures). CpuMallocTest skips itself: it measures glibc's
# malloc, which AddressSanitizer replaces.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch.sh
libtorch=$(gpipe_libtorch "${1:-debian}")
shift $(($# > 0 ? 1 : 0))
dir=build-sanitize-$libtorch
start=$SECONDS
GPIPE_LIBTORCH=$libtorch bash scripts/setup.sh
flags="-fsanitize=address,undefined -fno-sanitize=vptr -fno-sanitize-recover=undefined"
flags+=" -fno-omit-frame-pointer"
# shellcheck disable=SC2046  # word splitting of the argument list is intended
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
  -DGPIPE_BUILD_BENCHMARKS=OFF $(gpipe_cmake_args "$libtorch") >/dev/null
cmake --build "$dir"
echo "== built in $((SECONDS - start)) s"
# protect_shadow_gap=0: CUDA's runtime maps memory where AddressSanitizer guards by default.
export ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$dir" --output-on-failure -j2 -E '^(ReadmeCommandsRunAsWritten|CMakeOptionsConfigure)$' "$@"
echo "== sanitized tests passed in $((SECONDS - start)) s"
