#!/usr/bin/env bash
# On a fresh Debian 12 machine: installs what is needed, builds what the README's commands use
# (the gpipe command, the launcher and the distributed example, so that `cmake --install build`
# has all it installs; the first build shows its progress and takes minutes, later runs start at
# once), and runs the default job, `gpipe train`: a character-level GPT trained on
# /usr/share/common-licenses, pipelined over 2 stages. Arguments go to it (see `gpipe train
# --help`); it runs in the caller's folder, so paths such as --data or --trace are as typed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
(
  cd "$root"
  bash scripts/setup.sh
  bash scripts/build.sh gpipe_command gpipe_launch distributed_train
)
source "$root/scripts/libtorch.sh"
exec "$root/$(gpipe_build_dir "$(gpipe_libtorch)")/tools/gpipe/gpipe" train "$@"
