#!/usr/bin/env bash
# Builds and runs the benchmarks, each printing medians measured side by side in one run.
#
#   bash scripts/bench.sh [--paper] [benchmark ...]
#
# With no names, runs all of build/benchmarks/. Each runs in build/bench-results/, where those
# that write JSON reports (torchgpipe's suite: resnet101_speed, amoebanetd_speed,
# amoebanetd_memory, unet_speed, unet_memory, unet_timeline; peers) leave them; --paper gives
# the suite the reference's sizes (a GPU-class machine).
# glibc's malloc otherwise returns and refaults big blocks, which swings CPU timings by 2x.
set -euo pipefail
cd "$(dirname "$0")/.."
paper=()
if [[ "${1:-}" == "--paper" ]]; then
  paper=(--paper)
  shift
fi
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
suite=" resnet101_speed amoebanetd_speed amoebanetd_memory unet_speed unet_memory unet_timeline "
results="$PWD/build/bench-results"
mkdir -p "$results"

run() {
  local benchmark=$1
  echo "== $benchmark"
  local args=()
  if [[ "$suite" == *" $benchmark "* ]]; then args=(${paper[@]+"${paper[@]}"}); fi
  (cd "$results" && "$OLDPWD/build/benchmarks/$benchmark" ${args[@]+"${args[@]}"})
}

if (($# > 0)); then
  for benchmark in "$@"; do run "$benchmark"; done
else
  for benchmark in build/benchmarks/*; do
    [[ -x "$benchmark" && -f "$benchmark" ]] || continue
    run "$(basename "$benchmark")"
  done
fi
