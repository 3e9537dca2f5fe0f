# Sourced by the scripts: which LibTorch a build uses, and where it and its build live.
#
# GPIPE_LIBTORCH=wheel (default): LibTorch 2.11.0 with CUDA from PyPI's `torch` wheel, the
#   version of the project's GPU machine, in the virtual environment $GPIPE_VENV; builds in build/.
# GPIPE_LIBTORCH=debian: Debian's LibTorch 1.13 (CPU); builds in build-debian/.

GPIPE_TORCH_VERSION=2.11.0
# The reference, run beside gpipe by the gpu_pipeline benchmark (pure Python, any torch 2.x).
GPIPE_TORCHGPIPE_VERSION=0.0.7

# The configuration named by $1, else by $GPIPE_LIBTORCH, else wheel; exits 2 for another name.
gpipe_libtorch() {
  local name=${1:-${GPIPE_LIBTORCH:-wheel}}
  case "$name" in
    wheel | debian) echo "$name" ;;
    *)
      echo "gpipe: unknown LibTorch configuration '$name' (expected wheel or debian)" >&2
      exit 2
      ;;
  esac
}

gpipe_venv() { echo "${GPIPE_VENV:-$HOME/.cache/gpipe/venv}"; }

# The build folder of a configuration.
gpipe_build_dir() {
  if [[ "$1" == debian ]]; then echo build-debian; else echo build; fi
}

# The CMAKE_PREFIX_PATH that finds the LibTorch of the torch in Python $1. The wheel's own folder
# goes in too, so that its lib/ wins over a system LibTorch's (Debian's libtorch-dev) when both
# are installed.
gpipe_torch_prefix_path() {
  "$1" -W ignore -c 'import os, torch; print(torch.utils.cmake_prefix_path + ";" + os.path.dirname(torch.__file__))'
}

# CMake arguments that find the configuration's LibTorch.
gpipe_cmake_args() {
  if [[ "$1" == wheel ]]; then
    echo "-DCMAKE_PREFIX_PATH=$(gpipe_torch_prefix_path "$(gpipe_venv)/bin/python" 2>/dev/null)"
  fi
}
