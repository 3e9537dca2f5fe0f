#!/usr/bin/env bash
# Prepares what the GPU check needs besides torch, for a GPU machine that reaches no package
# registry: Debian's Gloo headers, GoogleTest, CLI11, nlohmann-json and tinyxml2, unpacked into a folder
# (default gpu-deps/, git-ignored) that travels with the working tree and is passed to
# `scripts/gpu-check.sh --deps DIR`. A few MiB; quick when present.
#
#   bash scripts/gpu-deps.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-gpu-deps}
packages=(libgloo-dev libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev libtinyxml2-dev
  libtinyxml2-9)
# .complete lists the packages unpacked: a folder made for another list is made again.
if [[ -f "$dir/.complete" && "$(cat "$dir/.complete")" == "${packages[*]}" ]]; then exit 0; fi
rm -rf "$dir"
mkdir -p "$dir/debs"
(cd "$dir/debs" && apt-get download -q "${packages[@]}" >download.log 2>&1) || {
  cat "$dir/debs/download.log" >&2
  exit 1
}
for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir"; done
rm -rf "$dir/debs"
echo "${packages[*]}" >"$dir/.complete"
echo "gpu-deps: ${packages[*]} in $dir/ ($(du -sh "$dir" | cut -f1))"
