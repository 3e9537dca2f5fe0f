#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU and a Python whose `torch` is LibTorch 2.x with CUDA
# (the project's GPU machine: torch 2.11.0+cu130, one H200), builds gpipe against that torch (the
# library, the tests and one benchmark), runs every *_CUDA test and the transparency tests (their
# GPU variants put several partitions on cuda:0), runs the gpu_pipeline benchmark (gpipe side by
# side with torchgpipe, which that Python must import), and writes under OUT:
#   gpu-check.json   the summary: machine, torch, CUDA, tests passed/failed/skipped, benchmark,
#                    where one step's time goes (trace-summary.json), the GPU issue's targets
#   tests.log        the tests' output          gpu_pipeline.json, benchmark.log   the benchmark's
#   traces/          one profiled step per model of plain, pipeline-8 and the arithmetic, each
#                    side (Chrome traces, gzipped)
#
#   bash scripts/gpu-check.sh [--out DIR] [--python PY] [--build-dir DIR] [--jobs N]
#                             [--deps DIR] [--allow-no-gpu]
#
#   --out DIR        where the report goes (default: $OUT, else gpu-check/)
#   --python PY      the Python whose torch to build against (default: python3)
#   --build-dir DIR  build there (default: build-gpu/); an existing build of the same torch is
#                    reused, as CI reuses the torch wheel's build/
#   --jobs N         parallel compile jobs (default: every core)
#   --deps DIR       Gloo's headers, GoogleTest, CLI11, nlohmann-json and tinyxml2 unpacked from
#                    Debian's packages, and torchgpipe's wheel, by scripts/gpu-deps.sh, for a
#                    machine without them that reaches no registry (the GPU machine: carry
#                    gpu-deps/ there)
#   --allow-no-gpu   without a GPU, run all the same (the *_CUDA tests skip, the benchmark runs
#                    on the CPU at small sizes) and exit 0; without it, a machine without a GPU
#                    fails the check
# Fits in 8 minutes on 16 cores; exits non-zero if a step fails or a test fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch.sh

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }
fail() {
  echo "gpu-check: $1" >&2
  exit 2
}

out=${OUT:-gpu-check}
python=python3
build=build-gpu
jobs=$(nproc)
allow_no_gpu=0
deps=""
while (($# > 0)); do
  case "$1" in
    --out | --python | --build-dir | --jobs | --deps)
      (($# >= 2)) || fail "$1 needs a value"
      case "$1" in
        --deps)
          [[ -d "$2/usr/include" ]] || fail "--deps $2 is not a folder made by scripts/gpu-deps.sh"
          deps=$(cd "$2" && pwd)
          ;;
        --out) out=$2 ;;
        --python) python=$2 ;;
        --build-dir) build=$2 ;;
        --jobs)
          [[ "$2" =~ ^[1-9][0-9]*$ ]] || fail "--jobs must be a positive integer, not '$2'"
          jobs=$2
          ;;
      esac
      shift 2
      ;;
    --allow-no-gpu)
      allow_no_gpu=1
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) fail "unknown argument '$1' (see --help)" ;;
  esac
done

start=$SECONDS
mkdir -p "$out"
out=$(cd "$out" && pwd)
command -v "$python" >/dev/null || fail "no Python '$python' (--python)"
# What the machine has, from the torch that gpipe builds against.
"$python" -W ignore - >"$out/torch.json" <<'PY' || fail "'$python' has no torch: pip install torch==2.11.0"
import json, torch
print(json.dumps({
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "cuda_available": torch.cuda.is_available(),
    "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
}))
PY
json() { "$python" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$@"; }
gpu=$(json "$out/torch.json" cuda_available)
if [[ "$gpu" != True && $allow_no_gpu == 0 ]]; then
  fail "torch $(json "$out/torch.json" torch) sees no CUDA device (--allow-no-gpu runs anyway)"
fi

echo "gpu-check: building in $build/ with $jobs jobs"
prefix_path=$(gpipe_torch_prefix_path "$python")
extra=()
if [[ -n "$deps" ]]; then
  prefix_path="$prefix_path;$deps/usr"
  extra=("-DCMAKE_CXX_FLAGS=-isystem $deps/usr/include")
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # A pure-Python wheel imports from its zip.
  for wheel in "$deps"/wheels/torchgpipe-*.whl; do
    if [[ -f "$wheel" ]]; then export PYTHONPATH="$wheel${PYTHONPATH:+:$PYTHONPATH}"; fi
  done
fi
"$python" -c "import torchgpipe" 2>/dev/null ||
  fail "'$python' cannot import torchgpipe: --deps DIR from scripts/gpu-deps.sh, or pip install --no-deps torchgpipe==0.0.7"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix_path" \
  ${extra[@]+"${extra[@]}"} >"$out/configure.log" 2>&1 ||
  fail "configuring failed; see $out/configure.log"
cmake --build "$build" -j "$jobs" --target gpipe_tests gpu_pipeline >"$out/build.log" 2>&1 ||
  fail "building failed; see $out/build.log"
build_seconds=$((SECONDS - start))

echo "gpu-check: tests (*_CUDA and transparency)"
tests_rc=0
"$build/tests/gpipe_tests" --gtest_filter='*_CUDA:TransparencyTest.*' \
  --gtest_output="json:$out/tests.json" >"$out/tests.log" 2>&1 || tests_rc=$?
tail -n 3 "$out/tests.log"

echo "gpu-check: benchmark"
bench_rc=0
device=cpu rounds=3  # the CPU's small sizes, in CI
if [[ "$gpu" == True ]]; then device=cuda rounds=5; fi
python_path=$("$python" -c "import sys; print(sys.executable)")
rm -rf "$out/traces" && mkdir -p "$out/traces"
(cd "$out" && "$OLDPWD/$build/benchmarks/gpu_pipeline" --rounds "$rounds" --device "$device" \
  --python "$python_path" --trace traces --json gpu_pipeline.json) >"$out/benchmark.log" 2>&1 ||
  bench_rc=$?
cat "$out/benchmark.log"
echo "gpu-check: where one step's time goes (traces/*.json.gz)"
"$python" benchmarks/gpu-pipeline/trace_summary.py "$out/traces" --json "$out/trace-summary.json" ||
  bench_rc=$?
gzip -f "$out"/traces/*.json 2>/dev/null || true

"$python" - "$out" "$build_seconds" "$tests_rc" "$bench_rc" "$((SECONDS - start))" <<'PY'
import json, os, sys
out, build_seconds, tests_rc, bench_rc, seconds = sys.argv[1], *map(int, sys.argv[2:])
def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None
tests = load("tests.json") or {}
cases = [c for suite in tests.get("testsuites", []) for c in suite.get("testsuite", [])]
skipped = [c["classname"] + "." + c["name"] for c in cases if c.get("result") == "SKIPPED"]
failed = [c["classname"] + "." + c["name"] for c in cases if c.get("failures")]
report = {
    "machine": load("torch.json"),
    "build_seconds": build_seconds,
    "tests": {"run": len(cases) - len(skipped), "failed": failed, "skipped": skipped,
              "exit_code": tests_rc},
    "benchmark": load("gpu_pipeline.json"),
    "trace_summary": load("trace-summary.json"),
    "benchmark_exit_code": bench_rc,
    "seconds": seconds,
}
# The targets of the GPU issue, read off the benchmark (informative: they fail nothing).
bench = report["benchmark"] or {}
targets = []
for row in (bench.get("overhead") or {}).get("gpipe", []):
    if row["chunks"] == 8:
        targets.append(("GPipe at 8 chunks / plain", row["ratio"], "<= 1.05"))
for model in bench.get("models", []):
    for row in model.get("contenders", []):
        over = row.get("gpipe_over_torchgpipe")
        if over is None:
            continue
        name = f'{model["model"]} {row["contender"]}'
        targets.append((f"{name}: gpipe / torchgpipe time", over["median"], "<= 1.0"))
        if row["contender"] != "plain":
            relative = row["gpipe_over_plain"] / row["torchgpipe_over_plain"]
            targets.append((f"{name}: (gpipe / plain) / (torchgpipe / plain)", relative, "<= 1.1"))
        gpipe_mib, torch_mib = row["gpipe"]["median_peak_mib"], row["torchgpipe"]["median_peak_mib"]
        if gpipe_mib is not None and torch_mib:
            targets.append((f"{name}: gpipe / torchgpipe peak memory", gpipe_mib / torch_mib, "<= 1.0"))
report["targets"] = [{"what": w, "value": v, "target": t} for w, v, t in targets]
for what, value, target in targets:
    print(f"  {what}: {value:.3f} (target {target})")
json.dump(report, open(os.path.join(out, "gpu-check.json"), "w"), indent=2)
print(f"gpu-check: {len(cases) - len(skipped) - len(failed)} passed, {len(failed)} failed, "
      f"{len(skipped)} skipped; report in {out}/gpu-check.json ({seconds} s)")
PY
((tests_rc == 0 && bench_rc == 0))
