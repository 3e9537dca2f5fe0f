#!/usr/bin/env bash
# Prepares what the GPU check needs besides torch, for a GPU machine that reaches no package
# registry: Debian's Gloo headers, GoogleTest, CLI11, nlohmann-json and tinyxml2, unpacked into a
# folder (default gpu-deps/, git-ignored), and torchgpipe's wheel (pure Python, imported from the
# zip) in its wheels/. The folder travels with the working tree and is passed to
# `scripts/gpu-check.sh --deps DIR`. A few MiB; quick when present. The wheel comes through the
# pip of scripts/setup.sh's virtual environment.
#
#   bash scripts/gpu-deps.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch.sh
dir=${1:-gpu-deps}
wheel="torchgpipe==$GPIPE_TORCHGPIPE_VERSION"
packages=(libgloo-dev libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev libtinyxml2-dev
  libtinyxml2-9)
# .complete lists the packages unpacked: a folder made for another list is made again.
if [[ -f "$dir/.complete" && "$(cat "$dir/.complete")" == "${packages[*]} $wheel" ]]; then exit 0; fi
rm -rf "$dir"
mkdir -p "$dir/debs"
(cd "$dir/debs" && apt-get download -q "${packages[@]}" >download.log 2>&1) || {
  cat "$dir/debs/download.log" >&2
  exit 1
}
for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir"; done
rm -rf "$dir/debs"
pip="$(gpipe_venv)/bin/pip"
[[ -x "$pip" ]] || {
  echo "gpu-deps: no $pip to download $wheel with: run scripts/setup.sh first" >&2
  exit 1
}
"$pip" download -q --disable-pip-version-check --no-deps -d "$dir/wheels" "$wheel"
echo "${packages[*]} $wheel" >"$dir/.complete"
echo "gpu-deps: ${packages[*]} $wheel in $dir/ ($(du -sh "$dir" | cut -f1))"
