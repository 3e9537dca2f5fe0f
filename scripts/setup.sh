#!/usr/bin/env bash
# Installs every Debian package gpipe needs; quick when they are all present already.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libtorch-dev          # LibTorch 1.13 (CPU), with c10d
  libgloo-dev           # the Gloo headers c10d's ProcessGroupGloo needs
  libopenblas0-pthread  # a fast BLAS in place of the reference one
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libtinyxml2-dev  # traces and benchmark reports (JSON), timelines (SVG)
)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo=sudo; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
