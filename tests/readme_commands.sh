#!/usr/bin/env bash
# Runs every shell block of README.md (```sh) as written, from the checkout's root, on a build that
# holds what scripts/run.sh builds; a block that cannot run here is named with the reason.
# HOME is a scratch folder (the install goes to its ~/.local) whose ~/.cache/gpipe/venv is the
# real virtual environment, which GPIPE_VENV names for the scripts, so that run.sh configures
# build/ as it was configured; my_project/ is made from the README's CMake block and
# examples/readme.cpp, and removed afterwards. Exits 77 (CTest: skipped) where the build is not
# the README's build/.
#
#   bash tests/readme_commands.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$(cd "$1" && pwd)
build_dir=$(cd "$2" && pwd)
if [[ "$build_dir" != "$source_dir/build" ]]; then
  echo "skipped: the README's commands use build/, and this build is $build_dir"
  exit 77
fi
cd "$source_dir"
source scripts/libtorch.sh
venv=$(gpipe_venv)

scratch=$(mktemp -d)
trap 'rm -rf "$scratch" "$source_dir/my_project"' EXIT
mkdir -p "$scratch/home/.cache/gpipe"
ln -s "$venv" "$scratch/home/.cache/gpipe/venv"

# The README's blocks: ```sh ones to run, and the ```cmake one that is my_project's CMakeLists.
blocks=$scratch/blocks
mkdir -p "$blocks"
awk -v dir="$blocks" '
  /^```sh$/ { n++; file = sprintf("%s/%02d.sh", dir, n); next }
  /^```cmake$/ { file = dir "/CMakeLists.txt"; next }
  /^```/ { file = ""; next }
  file != "" { print > file }
' README.md
[[ -f "$blocks/CMakeLists.txt" ]] || { echo "README.md has no \`\`\`cmake block"; exit 1; }
mkdir -p my_project
cp "$blocks/CMakeLists.txt" my_project/CMakeLists.txt
cp examples/readme.cpp my_project/main.cpp

# What cannot run here, and why.
reason_not_to_run() {
  if grep -q 'scripts/test.sh' "$1"; then echo "it runs every test, this one among them"; fi
  if grep -q -- '--nnodes 2' "$1"; then echo "it needs two machines"; fi
}

ran=0
for block in "$blocks"/*.sh; do
  reason=$(reason_not_to_run "$block")
  echo "== README block $(basename "$block" .sh):"
  sed 's/^/   /' "$block"
  if [[ -n "$reason" ]]; then
    echo "   not run: $reason"
    continue
  fi
  start=$SECONDS
  if ! HOME="$scratch/home" GPIPE_VENV="$venv" bash -euo pipefail "$block"; then
    echo "== README block $(basename "$block" .sh) failed"
    exit 1
  fi
  echo "   ran in $((SECONDS - start)) s"
  ran=$((ran + 1))
done
echo "== $ran README blocks ran as written"
