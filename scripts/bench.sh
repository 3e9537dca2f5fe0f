#!/usr/bin/env bash
# Builds and runs the benchmarks, each printing medians measured side by side in one run.
# glibc's malloc otherwise returns and refaults big blocks, which swings CPU timings by 2x.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295
for benchmark in "$@"; do
  echo "== $benchmark"
  "./build/benchmarks/$benchmark"
done
if (($# == 0)); then
  for benchmark in build/benchmarks/*; do
    [[ -x "$benchmark" && -f "$benchmark" ]] || continue
    echo "== $(basename "$benchmark")"
    "$benchmark"
  done
fi
