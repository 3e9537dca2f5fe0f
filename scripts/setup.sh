#!/usr/bin/env bash
# Installs what gpipe needs on a Debian 12 machine; quick (and silent) when all is present.
#
#   bash scripts/setup.sh [wheel|debian]     (default: $GPIPE_LIBTORCH, else wheel)
#
# wheel:  LibTorch 2.11.0 with CUDA 13.0, from PyPI's `torch` wheel, in a virtual environment
#         outside the source tree ($GPIPE_VENV, default ~/.cache/gpipe/venv), with torchgpipe 0.0.7
#         beside it for the gpu_pipeline benchmark. Gloo's headers, which the wheel leaves out,
#         come from Debian's libgloo-dev.
# debian: Debian's LibTorch 1.13 (CPU) from libtorch-dev.
# Both need the Debian packages below.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/libtorch.sh
libtorch=$(gpipe_libtorch "${1:-}")

packages=(
  cmake ninja-build g++ pkg-config python3-venv
  libgloo-dev           # the Gloo headers c10d's ProcessGroupGloo needs
  libopenblas0-pthread  # a fast BLAS in place of the reference one
  libgtest-dev libgmock-dev
  libcli11-dev          # the command lines of gpipe and gpipe_launch
  nlohmann-json3-dev libtinyxml2-dev  # traces and benchmark reports (JSON), timelines (SVG)
)
if [[ "$libtorch" == debian ]]; then
  packages+=(libtorch-dev)  # LibTorch 1.13 (CPU), with c10d
  packages+=(python3-torch)  # its torchrun, for the torchrun tests
fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done
if ((${#missing[@]} > 0)); then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo=sudo; fi
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi

if [[ "$libtorch" == wheel ]]; then
  venv=$(gpipe_venv)
  # The installed version, without importing torch (which takes seconds).
  installed=$("$venv/bin/python" -c "from importlib.metadata import version; print(version('torch'))" 2>/dev/null || true)
  if [[ "${installed%%+*}" != "$GPIPE_TORCH_VERSION" ]]; then
    echo "setup: installing torch==$GPIPE_TORCH_VERSION into $venv (about 4.6 GB; a few minutes)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "torch==$GPIPE_TORCH_VERSION"
  fi
  installed=$("$venv/bin/python" -c "from importlib.metadata import version; print(version('torchgpipe'))" 2>/dev/null || true)
  if [[ "$installed" != "$GPIPE_TORCHGPIPE_VERSION" ]]; then
    # --no-deps: it names torch, which is installed; pip must not replace it.
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps \
      "torchgpipe==$GPIPE_TORCHGPIPE_VERSION"
  fi
fi
